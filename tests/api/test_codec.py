"""Bodies are read exactly (orjson where it keeps every digit)."""

from __future__ import annotations

import pytest

from api.codec import dumps, loads


def test_bodies_are_read_exactly_even_where_orjson_would_round() -> None:
    """A field outside the transcript with an integer past 64 bits keeps every digit."""
    raw = b'{"model": "m", "seed": 123456789012345678901234567890, "messages": [], "x": NaN}'
    body = loads(raw)
    assert body["seed"] == 123456789012345678901234567890
    assert b"123456789012345678901234567890" in dumps(body)
    assert loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    with pytest.raises(ValueError):
        loads(b"{not json")
