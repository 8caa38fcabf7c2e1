"""Message content keys and the bounded, generational cache of counts."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.counting.cache import CountCache, RecentTranscript, missing
from shared.counting.messagekeys import KeyFields, checked_key, fields, message_key
from shared.errors import ConfigError, InvalidTranscript

CALL: dict[str, Any] = {
    "id": "c1",
    "type": "function",
    "function": {"name": "ls", "arguments": '{"d":"."}'},
}


def test_equal_content_gives_equal_keys() -> None:
    """Distinct message objects with equal content share a key; a counted change splits it."""
    m: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    same = copy.deepcopy(m)
    assert message_key(m) == message_key(same)
    renamed = copy.deepcopy(m)
    renamed["tool_calls"][0]["function"]["name"] = "cat"
    assert message_key(renamed) != message_key(m)
    assert message_key({"role": "user", "content": "a", "name": "x"}) != message_key(
        {"role": "user", "content": "a"}
    )


def test_key_ignores_what_is_not_counted() -> None:
    """Keys and ids that never reach the tokenizer (call ids, extra keys) do not split entries."""
    a = {"role": "user", "content": "hi", "extra": {"x": [1]}}
    assert fields(message_key(a)) == fields(message_key({"role": "user", "content": "hi"}))
    other_id = copy.deepcopy(CALL) | {"id": "zzz"}
    assert message_key({"role": "assistant", "content": "", "tool_calls": [CALL]}) == message_key(
        {"role": "assistant", "content": "", "tool_calls": [other_id]}
    )


def test_fields_decompose_every_counted_part() -> None:
    """fields() lists every counted text and counts non-text parts, calls and a name."""
    m = {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:..."}},
        ],
        "name": "ann",
    }
    assert fields(message_key(m)) == KeyFields(["user", "look", "ann"], 1, 0, True)
    call2 = {"id": "c2", "function": {"name": "cat", "arguments": {"b": 2, "a": 1}}}
    tool_use = {"role": "assistant", "content": "ok", "tool_calls": [CALL, call2]}
    assert fields(message_key(tool_use)) == KeyFields(
        ["assistant", "ok", "ls", '{"d":"."}', "cat", '{"a":1,"b":2}'], 0, 2, False
    )
    result = {"role": "tool", "content": "out", "tool_call_id": "c1"}
    assert fields(message_key(result)) == KeyFields(["tool", "out", "c1"], 0, 0, False)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"role": 3, "content": "x"}, "'role' must be a string"),
        ({"role": "user", "content": "x", "name": 5}, "'name' must be a string"),
        ({"role": "user", "content": 5}, "'content' must be"),
        ({"role": "user", "content": [{"type": "text"}]}, "needs a string 'text'"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, "tool call 0"),
        ({"role": "assistant", "content": None, "tool_calls": "ls"}, "must be a list"),
        ([1, 2], "must be an object"),
    ],
)
def test_checked_key_names_the_fault(message: Any, reason: str) -> None:
    """The slow, checking path raises InvalidTranscript with the precise reason."""
    with pytest.raises(InvalidTranscript, match=reason):
        checked_key(message)


def test_fields_rejects_keys_of_wrong_types() -> None:
    """A fast key built from wrongly typed fields cannot be measured (so it is never cached)."""
    for bad in ({"role": 1, "content": "x"}, {"role": "user", "content": ("a", 5), "name": "n"}):
        with pytest.raises(InvalidTranscript):
            fields(message_key(bad))


messages_st = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"])},
    optional={
        "content": st.one_of(
            st.none(),
            st.text(max_size=30),
            st.lists(
                st.one_of(
                    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=10)),
                    st.just({"type": "image_url", "image_url": {"url": "u"}}),
                ),
                max_size=3,
            ),
        ),
        "name": st.text(max_size=5),
        "tool_call_id": st.text(min_size=1, max_size=5),
        "tool_calls": st.lists(
            st.builds(
                lambda n, a: {"id": "c", "function": {"name": n, "arguments": a}},
                st.text(max_size=5),
                st.one_of(
                    st.text(max_size=10), st.dictionaries(st.text(max_size=3), st.integers())
                ),
            ),
            max_size=3,
        ),
    },
)


@given(messages_st)
def test_fast_and_checked_keys_agree(message: dict[str, Any]) -> None:
    """For any well-formed message the fast key and the checked key describe the same counts."""
    assert fields(message_key(message)) == fields(checked_key(message))


def test_cache_bounded_by_entries() -> None:
    """However many keys are put, at most max_entries are held."""
    cache = CountCache(max_entries=10, max_chars=10_000)
    for i in range(100):
        cache.put(("user", f"m{i}"), i)
        assert len(cache) <= 10
    assert cache.get_many([("user", "m99")]) == [99]
    assert cache.get_many([("user", "m0")]) == [None]


def test_cache_bounded_by_chars() -> None:
    """At most max_chars characters of keys are held; a key over half of it is not cached."""
    cache = CountCache(max_entries=1000, max_chars=100)
    for i in range(50):
        cache.put(("user", f"{i:020d}"), i)  # 24 chars each
        assert cache.chars <= 100
    cache.put(("user", "x" * 60), 1)
    assert cache.get_many([("user", "x" * 60)]) == [None]


def test_recently_used_entries_survive_a_generation_change() -> None:
    """An entry read during the current generation is carried into the next one (LRU-like)."""
    cache = CountCache(max_entries=8, max_chars=10_000)
    cache.put(("user", "keep"), 7)
    for i in range(3):
        cache.put(("user", f"a{i}"), i)  # young is now full (4 entries)
    for i in range(4):
        cache.put(("user", f"b{i}"), i)  # rotation: "keep" is now old
        assert cache.get_many([("user", "keep")]) == [7]  # read: promoted to young
    for i in range(8):
        cache.put(("user", f"c{i}"), i)
    assert cache.get_many([("user", "keep"), ("user", "a0")]) == [None, None]


@pytest.mark.parametrize("kwargs", [{"max_entries": 1}, {"max_chars": 0}, {"max_entries": 2.5}])
def test_cache_rejects_impossible_bounds(kwargs: dict[str, Any]) -> None:
    """Bounds below 2 or not integers raise ConfigError."""
    with pytest.raises(ConfigError):
        CountCache(**kwargs)


def test_cache_is_thread_safe() -> None:
    """Concurrent puts and reads never corrupt values or exceed the bounds."""
    cache = CountCache(max_entries=64, max_chars=4096)
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(2000):
            key = ("user", f"{(i * 7 + t) % 300}")
            cache.put(key, int(key[1]))
            got = cache.get_many([key])[0]
            if got is not None and got != int(key[1]):
                errors.append(f"{key} -> {got}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(cache) <= 64
    assert cache.chars <= 4096


def test_missing_lists_none_positions() -> None:
    """missing() returns the index of every None, in order."""
    assert missing([1, None, 2, None, None]) == [1, 3, 4]
    assert missing([1, 2]) == []


def test_recent_transcript_is_bounded_and_matches_by_content() -> None:
    """Only transcripts up to max_messages are kept; equal copies match, an edit stops the match."""
    recent = RecentTranscript(max_messages=3)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    recent.remember(msgs, 0, [1, 2, 3, 4])
    assert len(recent) == 0
    recent.remember(msgs[:3], 0, [1, 2, 3])
    assert recent.known(copy.deepcopy(msgs)) == [1, 2, 3]
    msgs[1]["content"] = "changed"
    assert recent.known(msgs) == [1]
    assert recent.known([{"role": "user", "content": "other"}]) == []


def test_recent_transcript_copies_every_counted_field() -> None:
    """In-place edits of part texts or call arguments make the message differ from its copy."""
    recent = RecentTranscript()
    parts: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "a"}]}
    calls: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [copy.deepcopy(CALL)],
    }
    recent.remember([parts, calls], 0, [5, 6])
    assert recent.known([parts, calls]) == [5, 6]
    calls["tool_calls"][0]["function"]["arguments"] = "{}"
    assert recent.known([parts, calls]) == [5]
    parts["content"][0]["text"] = "b"
    assert recent.known([parts, calls]) == []


def test_recent_transcript_bounded_by_chars() -> None:
    """A transcript whose string content exceeds max_chars is not kept."""
    recent = RecentTranscript(max_chars=10)
    recent.remember([{"role": "user", "content": "x" * 11}], 0, [5])
    assert len(recent) == 0
    recent.remember([{"role": "user", "content": "x" * 10}], 0, [5])
    assert len(recent) == 1
