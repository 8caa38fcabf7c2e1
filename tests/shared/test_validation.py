"""Validation of a growing transcript re-checks only what is new, and is exactly as strict."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidTranscript
from shared.messages import validate
from shared.validation import ValidatedPrefixes
from tests.shared.generated import transcripts


def turn(i: int) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": f"out {i}"},
    ]


@settings(max_examples=80, deadline=None)
@given(transcripts(max_groups=12))
def test_same_verdict_as_a_full_check_at_every_length(msgs: list[dict[str, Any]]) -> None:
    """Replayed turn by turn, the memo accepts exactly what validate accepts."""
    memo = ValidatedPrefixes()
    for n in range(1, len(msgs) + 1):
        assert memo.validate(msgs[:n]) == validate(msgs[:n])


@settings(max_examples=80, deadline=None)
@given(transcripts(max_groups=12), st.integers(0, 10_000), st.sampled_from(["drop", "twice"]))
def test_same_verdict_on_broken_pairings(msgs: list[dict[str, Any]], seed: int, how: str) -> None:
    """A tool result removed or repeated: the memo refuses exactly where validate refuses."""
    tools = [i for i, m in enumerate(msgs) if m["role"] == "tool"]
    if not tools:
        return
    i = tools[seed % len(tools)]
    broken = msgs[:i] + msgs[i + 1 :] if how == "drop" else msgs[: i + 1] + msgs[i:]
    memo = ValidatedPrefixes()
    for n in range(1, len(broken) + 1):
        try:
            expected: Any = validate(broken[:n])
        except InvalidTranscript as exc:
            expected = (exc.index, exc.reason)
        try:
            got: Any = memo.validate(broken[:n])
        except InvalidTranscript as exc:
            got = (exc.index, exc.reason)
        assert got == expected


def test_a_message_changed_in_place_is_checked_again() -> None:
    """Mutating an already-checked message cannot slip past the memo."""
    memo = ValidatedPrefixes()
    msgs = [{"role": "user", "content": "task"}, *turn(0), *turn(1)]
    memo.validate(msgs)
    msgs[2]["tool_call_id"] = "nobody"
    with pytest.raises(InvalidTranscript, match="message 2: tool_call_id 'nobody'"):
        memo.validate([*msgs, {"role": "user", "content": "more"}])


def test_an_error_after_the_prefix_names_its_absolute_index() -> None:
    """A fault in the new part is reported at its index in the whole transcript."""
    memo = ValidatedPrefixes()
    msgs = [{"role": "user", "content": "task"}, *turn(0)]
    memo.validate(msgs)
    with pytest.raises(InvalidTranscript, match="message 3: unknown role 'bot'"):
        memo.validate([*msgs, {"role": "bot", "content": "x"}])


def test_pending_calls_carry_over_the_remembered_prefix() -> None:
    """A tool result answering a call at the end of the remembered prefix is accepted."""
    memo = ValidatedPrefixes()
    msgs = [{"role": "user", "content": "task"}, turn(0)[0]]
    memo.validate(msgs)
    assert memo.validate([*msgs, turn(0)[1]])[-1]["tool_call_id"] == "c"
    with pytest.raises(InvalidTranscript, match="message 2"):
        memo.validate([*msgs, {"role": "tool", "tool_call_id": "zz", "content": ""}])


def test_state_grows_with_the_transcript_and_restarts_on_a_change() -> None:
    """The caller's state sees every message once while the prefix holds, all again after."""
    memo: ValidatedPrefixes[list[str]] = ValidatedPrefixes()
    seen: list[list[str]] = []

    def grow(state: list[str] | None, msgs: list[dict[str, Any]]) -> list[str]:
        state = state if state is not None else []
        if not state:
            seen.append(state)
        state += [str(m["content"]) for m in msgs[len(state) :]]
        return state

    msgs = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a"}]
    assert memo.validate_with(msgs, grow)[1] == ["task", "a"]
    grown = [*msgs, {"role": "user", "content": "b"}]
    assert memo.validate_with(grown, grow)[1] == ["task", "a", "b"]
    assert len(seen) == 1, "a grown transcript reuses the state"
    grown[2]["content"] = "changed"
    assert memo.validate_with(grown, grow)[1] == ["task", "a", "changed"]
    assert len(seen) == 2, "a message changed in place starts the state over"


def test_a_failing_grow_forgets_the_conversation() -> None:
    """State that may be half grown is never handed out again."""
    memo: ValidatedPrefixes[list[int]] = ValidatedPrefixes()
    msgs = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a"}]
    memo.validate_with(msgs, lambda s, m: [len(m)])

    def broken(state: list[int] | None, m: list[dict[str, Any]]) -> list[int]:
        raise RuntimeError("counter failed")

    with pytest.raises(RuntimeError):
        memo.validate_with([*msgs, {"role": "user", "content": "b"}], broken)
    assert memo.validate_with(msgs, lambda s, m: s if s is not None else [-1])[1] == [-1]


def test_named_conversations_that_open_alike_are_remembered_apart() -> None:
    """Two conversations with one opening, named, each keep their state between calls."""
    memo: ValidatedPrefixes[str] = ValidatedPrefixes()
    opening = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    a, b = [*opening, *turn(0)], [*opening, *turn(1)]
    given: list[str | None] = []

    def grow(state: str | None, msgs: list[dict[str, Any]]) -> str:
        given.append(state)
        return str(msgs[-1]["content"])

    for name in ("a", "b", "a", "b"):
        memo.validate_with(a if name == "a" else b, grow, ("tenant", name))
    assert given == [None, None, "out 0", "out 1"]
    given.clear()
    for msgs in (a, b, a):  # unnamed, they share the opening's entry and evict each other
        memo.validate_with(msgs, grow)
    assert given == [None, None, None]


def test_a_name_never_lets_other_content_pass() -> None:
    """A transcript under a name remembered for other messages is checked in full."""
    memo = ValidatedPrefixes()
    msgs = [{"role": "user", "content": "task"}, *turn(0)]
    memo.validate_with(msgs, None, "chat-1")
    broken = [{"role": "user", "content": "task"}, turn(0)[1], turn(0)[0]]
    with pytest.raises(InvalidTranscript, match="message 1"):
        memo.validate_with(broken, None, "chat-1")


def test_frozen_snapshots_are_recognised_by_their_messages() -> None:
    """Snapshots sharing message objects skip the comparison, and still get the same verdicts
    and state as checked transcripts; an equal copy of other objects is compared as usual."""
    memo: ValidatedPrefixes[int] = ValidatedPrefixes()
    given: list[int | None] = []

    def grow(state: int | None, msgs: list[dict[str, Any]]) -> int:
        given.append(state)
        return len(msgs)

    msgs = [{"role": "user", "content": "task"}, *turn(0), *turn(1), *turn(2)]
    for end in (3, 3, 5, 7):
        snapshot = msgs[:end]  # a new list each time, the same message objects
        assert memo.validate_with(snapshot, grow, "c", frozen=True)[0] == validate(snapshot)
    assert given == [None, 3, 3, 5]
    rebuilt = [dict(m) for m in msgs]  # equal, other objects: compared, then reused
    memo.validate_with(rebuilt, grow, "c", frozen=True)
    assert given[-1] == 7
    with pytest.raises(InvalidTranscript, match="message 7"):
        memo.validate_with([*rebuilt, turn(3)[1]], grow, "c", frozen=True)
