"""Bodies are read exactly (orjson where it keeps every digit) and strictly (no NaN,
Infinity, or integers past the bound), naming where what is refused stands."""

from __future__ import annotations

import pytest

from api.codec import MAX_INT_DIGITS, NotStrictJSON, dumps, loads


def test_bodies_are_read_exactly_even_where_orjson_would_round() -> None:
    """A field outside the transcript with an integer past 64 bits keeps every digit."""
    raw = b'{"model": "m", "seed": 123456789012345678901234567890, "messages": []}'
    body = loads(raw)
    assert body["seed"] == 123456789012345678901234567890
    assert b"123456789012345678901234567890" in dumps(body)
    assert loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    with pytest.raises(ValueError):
        loads(b"{not json")


@pytest.mark.parametrize(
    ("raw", "what", "where"),
    [
        (b'{"a": [1, {"b": NaN}]}', "NaN", "a[1].b"),
        (b'{"messages": [{"w": Infinity}]}', "Infinity", "messages[0].w"),
        (b"[-Infinity]", "-Infinity", "[0]"),
        (b'{"t": 1e400}', "1e400", "t"),
        (b'{"m": [{"n": -1E999}]}', "-1E999", "m[0].n"),
        (b"NaN", "NaN", "the top level"),
        (b'{"n": %s}' % (b"7" * 5000), "an integer of 5000 digits", "n"),
        (b'{"messages": [{"n": %s}]}' % (b"7" * 300), "an integer of 300 digits", "messages[0].n"),
    ],
)
def test_what_strict_json_refuses_is_named_with_its_path(raw: bytes, what: str, where: str) -> None:
    """NaN, infinities, doubles out of range and integers past the bound are refused, saying
    what and where; nothing else changes."""
    with pytest.raises(NotStrictJSON) as caught:
        loads(raw)
    assert what in caught.value.what and caught.value.where == where


def test_strict_json_keeps_exact_big_integers_within_the_bound() -> None:
    """An integer of up to `MAX_INT_DIGITS` digits outside the transcript is read exactly,
    and one digit more is refused."""
    big = int("9" * MAX_INT_DIGITS)
    assert loads(b'{"seed": %d}' % big) == {"seed": big}
    with pytest.raises(NotStrictJSON):
        loads(b'{"seed": %d}' % (big * 10))


def test_what_was_stored_before_the_rule_still_reads() -> None:
    """`strict=False` (the cache's read of stored messages) reads NaN as the stdlib does."""
    value = loads(b'{"w": NaN}', strict=False)
    assert value["w"] != value["w"]
