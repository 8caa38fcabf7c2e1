"""Checks every prepared prompt must pass, shared by the property and real-transcript tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.counting.protocol import TokenCounter
from shared.errors import DoesNotFit
from shared.formats.anthropic import to_anthropic
from shared.messages import Message, groups, is_request, thinking_turns, validate
from shared.policy import ContextPolicy, Prepared
from shared.strategies.drop import drop_marker

CUT_MARK = "characters cut to save context ...]"


def _same_or_shortened(orig: Message, out: Message) -> bool:
    if orig == out:
        return True
    keys = ("role", "tool_call_id", "tool_calls", "name")
    if any(orig.get(k) != out.get(k) for k in keys):
        return False
    if orig.get("role") != "tool":  # the last resort's cut of a long text, marked as such
        return CUT_MARK in str(out.get("content")) and CUT_MARK not in str(orig.get("content"))
    return isinstance(out.get("content"), str | list)  # cleared or truncated tool output


def _is_synthetic(m: Message) -> bool:
    content = m.get("content")
    return (
        m.get("role") == "user"
        and isinstance(content, str)
        and (content.startswith("[Summary of messages") or "were dropped here" in content)
    )


def origins(transcript: Sequence[Message], out: Sequence[Message]) -> list[int]:
    """Original index of each output message (-1 for prefit's own), asserting order is kept."""
    found: list[int] = []
    i = 0
    for m in out:
        if _is_synthetic(m) and m not in transcript[i : i + 1]:
            found.append(-1)
            continue
        while i < len(transcript) and not _same_or_shortened(transcript[i], m):
            i += 1
        assert i < len(transcript), (
            f"output message {len(found)} is not from the transcript in order"
        )
        found.append(i)
        i += 1
    return found


def latest_origins(transcript: Sequence[Message], out: Sequence[Message]) -> list[int]:
    """`origins` matched from the end: each message at its latest possible index (equal
    messages, an empty system message twice, make the earliest match ambiguous)."""
    n = len(transcript)
    flipped = origins(transcript[::-1], out[::-1])
    return [-1 if o < 0 else n - 1 - o for o in flipped[::-1]]


def check(
    policy: ContextPolicy,
    transcript: Sequence[Message],
    prepared: Prepared,
    *,
    counter: TokenCounter,
    tools: Sequence[dict[str, Any]] = (),
    model: str | None = None,
    pressure: float = 1.0,
) -> None:
    """Fits, keeps pairs, head, last group and order; unchanged under the trigger."""
    out = prepared.messages
    report = prepared.report
    assert report is not None
    budget = policy.budget(model)
    tokens = counter.count(out, tools, model)
    assert tokens / pressure <= budget, f"{tokens} tokens over budget {budget}"
    validate(out)  # every tool result still answers the assistant message right before it
    where = origins(transcript, out)
    _check_pairs(transcript, out, where, latest_origins(transcript, out))
    head = policy.head(transcript)
    kept = set(where)
    lost = [i for i in range(head.end) if head.protects(i) and i not in kept]
    assert not lost, f"head messages {lost} were cut"
    if head.task is not None:
        assert head.task in kept and out[where.index(head.task)] == transcript[head.task], (
            "the task (first user message) was not kept as it was"
        )
    _check_latest_request(transcript, prepared, counter, model, pressure)
    a, b = groups(transcript)[-1] if transcript else (0, 0)
    last = latest_origins(transcript, out)[-(b - a) :] if b > a else []
    assert last == list(range(a, b)), "last turn group not kept"
    if counter.count(transcript, tools, model) / pressure <= policy.trigger * budget:
        assert out == list(transcript), "changed although under the trigger"


def _check_latest_request(
    transcript: Sequence[Message],
    prepared: Prepared,
    counter: TokenCounter,
    model: str | None,
    pressure: float,
) -> None:
    """The user's latest request (`is_request`: not a reminder, not the rest of a tool-result
    turn) is kept unless a summary folds it in, it is large, or the prompt with it back (and
    the marker a second run of dropped turns needs) is over budget."""
    report = prepared.report
    assert report is not None
    last = max((i for i, m in enumerate(transcript) if is_request(m)), default=None)
    if last is None or transcript[last] in prepared.messages:
        return
    summary = report["summary"]
    folded = summary is not None and summary["upto"] > last
    small = counter.count([transcript[last]], (), model) <= 0.1 * report["target_tokens"]
    back = [*prepared.messages, transcript[last], drop_marker(len(transcript), len(transcript))]
    overflows = counter.count(back, (), model) / pressure > report["budget"]
    assert folded or not small or overflows, f"the user's latest message ({last}) was dropped"


def _check_pairs(
    transcript: Sequence[Message], out: Sequence[Message], *matchings: list[int]
) -> None:
    """No turn group is split, under one of the ways to match the output to the transcript."""
    errors = [_split(transcript, set(where)) for where in matchings]
    assert None in errors, errors[0]


def _split(transcript: Sequence[Message], kept: set[int]) -> str | None:
    for a, b in groups(transcript):
        present = [i in kept for i in range(a, b)]
        if any(present) and not all(present):
            return f"turn group [{a}, {b}) split"
    return None


def assert_uncuttable(e: DoesNotFit) -> None:
    """With the default strategies, a refusal means what may never be cut (head, recent
    turns, tool specs) is over the budget by itself: a kept request, a summary or a marker
    never causes one."""
    never_cut = e.head_tokens + e.tail_tokens + e.tools_tokens
    assert never_cut > e.budget, f"refused although head, tail and tools ({never_cut}) fit"


def assert_justified(e: DoesNotFit) -> None:
    """A refusal's own figures show what was kept is over the budget (no pressure applied)."""
    kept = e.head_tokens + e.tail_tokens + e.tools_tokens + e.other_tokens
    assert kept > e.budget, f"refused although what was kept ({kept}) is within {e.budget}"


def check_thinking(transcript: Sequence[Message], out: Sequence[Message]) -> None:
    """Every thinking turn (shared/messages.py) is kept whole or not at all, and, sent to
    Anthropic, every assistant turn the prompt holds starts with its thinking block, the
    final one included (the transcripts given open every turn with one, as thinking does)."""
    inside, _ = thinking_turns(transcript)
    turns: dict[int, list[int]] = {}
    for i, start in enumerate(inside):
        if start >= 0:
            turns.setdefault(start, [start]).append(i)
    errors = [_thinking_split(turns, set(w)) for w in (origins(transcript, out),)]
    errors.append(_thinking_split(turns, set(latest_origins(transcript, out))))
    assert None in errors, errors[0]
    _, sent = to_anthropic(out)
    refusal = thinking_refusal(sent)
    assert refusal is None, refusal


def thinking_refusal(sent: Sequence[dict[str, Any]]) -> str | None:
    """Anthropic's refusal of Anthropic `messages` with thinking on, when an assistant
    message after a user message that is not only tool results (a turn's start, to the
    strictest reading) does not start with a thinking block (for transcripts that open every
    such turn with one); None when none is found."""
    for k in range(1, len(sent)):
        before, m = sent[k - 1], sent[k]
        if m["role"] != "assistant" or before["role"] != "user" or _only_results(before):
            continue
        first = m["content"][0]["type"] if isinstance(m["content"], list) else "text"
        if first not in ("thinking", "redacted_thinking"):
            return (
                f"messages.{k}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                f"found `{first}`. When `thinking` is enabled, a final `assistant` message must "
                "start with a thinking block"
            )
    return None


def _only_results(m: dict[str, Any]) -> bool:
    content = m.get("content")
    return isinstance(content, list) and all(b.get("type") == "tool_result" for b in content)


def _thinking_split(turns: dict[int, list[int]], kept: set[int]) -> str | None:
    for start, members in turns.items():
        present = [i in kept for i in members]
        if any(present) and not all(present):
            return f"thinking turn from {start} split: {sorted(kept & set(members))} kept"
    return None


def check_reasoning(items: Sequence[dict[str, Any]]) -> None:
    """Sent to the Responses API, every reasoning item is followed by the item it produced
    ("Item 'rs_..' of type 'reasoning' was provided without its required following item"),
    and every function_call_output answers a call sent before it."""
    called: set[str] = set()
    for k, item in enumerate(items):
        if item.get("type") == "reasoning":
            after = items[k + 1] if k + 1 < len(items) else {}
            assert (
                after.get("type") in ("function_call", "message")
                and after.get("role", "assistant") == "assistant"
            ), (
                f"Item '{item['id']}' of type 'reasoning' was provided without its required "
                "following item."
            )
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        if item.get("type") == "function_call_output":
            assert item["call_id"] in called, (
                f"No tool call found for function call output with call_id {item['call_id']}."
            )
