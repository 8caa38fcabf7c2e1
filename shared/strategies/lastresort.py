"""The last resort before refusing: shorten the tool outputs nothing else may touch.

`TruncateToolResults` keeps 8,000 characters of each output whatever the window, and the
head and the recent turns are never cleared or dropped, so a small window can be blown by
a few large outputs in the very turns the model needs. Before `prepare` gives up with
`DoesNotFit`, the tool results still in the prompt are shortened further (start and end
kept, the same marker as truncation), oldest first, so the very last result is cut last,
each only as deep as the remaining excess needs and never below `FLOOR_CHARS`. If that is
not enough, the long texts of the other messages outside the head follow the same way
(an agent's 30k-character reasoning or a pasted log among the recent turns), oldest first;
the head (system prompt, task) and the transcript's last message are never cut.

Images and other non-text parts (audio, files) of tool results count 1,600 tokens each
whatever the text around them, so a few screenshots in the recent turns can still blow a
small window. If the texts at their floor are not enough, those parts are replaced one by
one with a short text placeholder (`PART_PLACEHOLDER`), oldest first so the very last
result's go last, recorded as `{"strategy": "LastResortDropParts", "saved", "messages":
[original indices], "parts": n}`. Only tool results outside the head are touched, never
the transcript's last message, and never a `thinking`/`redacted_thinking` block (its
signature must come back as it was sent).

Only what may never be cut (the head, the recent turns, the tool specs) justifies a refusal:
when the prompt is still over the budget after all that, what `DropOldest` kept as a courtesy
goes before `prepare` refuses (`shed_kept`): first the user's latest request it kept between
the head and the recent turns (its run of dropped groups joins the others behind one marker,
`LastResortDropRequest`), then the drop markers themselves (`LastResortDropMarkers`).
"""

from __future__ import annotations

import math
from typing import Any

from shared.messages import Message
from shared.strategies.drop import drop_runs, droppable, marker_counts, pinned
from shared.strategies.origins import SYNTHETIC
from shared.strategies.truncate import TruncateToolResults
from shared.strategies.work import Work

FLOOR_CHARS = 1_000
NAME = "LastResortTruncate"
PARTS_NAME = "LastResortDropParts"
REQUEST_NAME = "LastResortDropRequest"
MARKERS_NAME = "LastResortDropMarkers"
PART_PLACEHOLDER = "[{kind} removed to save context]"
_KEPT_PARTS = frozenset({"text", "thinking", "redacted_thinking"})
_MAX_TRIES = 4  # estimates of one output's cut before it goes straight to the floor


def shorten_protected(work: Work, budget: int) -> None:
    """Shorten tool outputs in `work` until it fits `budget` or all are at `FLOOR_CHARS`."""
    work.align()
    before = work.tokens()
    if before <= budget:
        return
    changed: list[int] = []
    positions = [p for p, m in enumerate(work.messages) if _is_long_result(m)]
    positions += [p for p in range(len(work.messages)) if _is_long_text(work, p)]
    for p in positions:
        if work.tokens() <= budget:
            break
        if _shorten(work, p, budget):
            changed.append(work.origin[p])
    if changed:
        work.record(NAME, before, messages=changed, floor_chars=FLOOR_CHARS)
    if work.tokens() > budget:
        _drop_parts(work, budget)


def shed_kept(work: Work, budget: int) -> None:
    """Over `budget` still: drop the latest request `DropOldest` kept, then its markers."""
    work.align()
    # only what DropOldest kept past everything else it could drop: with older turns still
    # in (strategies without DropOldest), the latest request is not the one to go; with none
    # left, a request too big to pin would have been droppable, so `pinned` finds the kept one
    at = None if droppable(work) else pinned(work, len(work.messages))
    if work.tokens() > budget and at is not None:
        before, request = work.tokens(), work.origin[at]
        drop_runs(work, work.messages, work.origin, [(at, at + 1)])
        work.dropped_groups += 1
        work.dropped_messages += 1
        work.record(REQUEST_NAME, before, messages=[request])
    markers = [p for p, m in enumerate(work.messages) if _is_marker(work, p, m)]
    if work.tokens() > budget and markers:
        before = work.tokens()
        dropped = set(markers)
        keep = [p for p in range(len(work.messages)) if p not in dropped]
        work.replace([work.messages[p] for p in keep], [work.origin[p] for p in keep])
        work.record(MARKERS_NAME, before, markers=len(markers))


def _is_marker(work: Work, p: int, m: Message) -> bool:
    return work.origin[p] == SYNTHETIC and marker_counts(m) is not None


def _drop_parts(work: Work, budget: int) -> None:
    """Replace non-text parts of the tool results that may lose them, oldest first."""
    before = work.tokens()
    changed: list[int] = []
    dropped = 0
    for p in range(len(work.messages)):
        if work.tokens() <= budget:
            break
        if not _may_lose_parts(work, p):
            continue
        n = _drop_parts_of(work, p, budget)
        if n:
            changed.append(work.origin[p])
            dropped += n
    if changed:
        work.record(PARTS_NAME, before, messages=changed, parts=dropped)


def _drop_parts_of(work: Work, p: int, budget: int) -> int:
    """Replace the parts of the message at `p` one by one until it fits; how many went."""
    dropped = 0
    content = list(work.messages[p]["content"])
    for k, part in enumerate(content):
        if work.tokens() <= budget:
            break
        if _droppable(part):
            content[k] = {"type": "text", "text": PART_PLACEHOLDER.format(kind=part["type"])}
            _put(work, p, {**work.messages[p], "content": list(content)})
            dropped += 1
    return dropped


def _may_lose_parts(work: Work, p: int) -> bool:
    """A tool result outside the head, not the transcript's last, with a droppable part."""
    m, o = work.messages[p], work.origin[p]
    if not isinstance(m, dict) or m.get("role") != "tool" or not isinstance(m.get("content"), list):
        return False
    if not 0 <= o < len(work.transcript) - 1 or work.head.protects(o):
        return False
    return any(_droppable(part) for part in m["content"])


def _droppable(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") not in _KEPT_PARTS


def _shorten(work: Work, p: int, budget: int) -> bool:
    """Cut the output at position `p` as far as the excess needs (floor included).

    The cut is made on the transcript's own message when there is one, so a result that
    truncation already shortened carries one marker that counts every character cut.
    """
    length = _text_chars(work.messages[p])
    o = work.origin[p]
    original = work.transcript[o] if o >= 0 else work.messages[p]
    for attempt in range(_MAX_TRIES + 1):
        excess = work.tokens() - budget
        now = _text_chars(work.messages[p])
        if excess <= 0 or now <= FLOOR_CHARS:
            break
        # the output's characters per measured token (sizes are raw: scale them as the
        # whole prompt is scaled), and 10% more than the excess to land under the budget
        scale = work.tokens() / max(1, sum(map(work.size, work.messages)))
        per_token = now / max(1.0, work.size(work.messages[p]) * scale)
        cut = math.ceil(excess * 1.1 * per_token)
        keep = FLOOR_CHARS if attempt == _MAX_TRIES else max(FLOOR_CHARS, now - cut)
        short = TruncateToolResults(max_chars=keep).shorten(original)
        if short is None:
            break
        _put(work, p, short)
    return _text_chars(work.messages[p]) < length


def _put(work: Work, p: int, m: Message) -> None:
    messages = list(work.messages)
    messages[p] = m
    work.replace(messages, list(work.origin))


def _is_long_result(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "tool" and _text_chars(m) > FLOOR_CHARS


def _is_long_text(work: Work, p: int) -> bool:
    """A long text outside the head that is not a tool result nor the transcript's last."""
    m, o = work.messages[p], work.origin[p]
    if not isinstance(m, dict) or m.get("role") == "tool" or _text_chars(m) <= FLOOR_CHARS:
        return False
    return 0 <= o < len(work.transcript) - 1 and not work.head.protects(o)


def _text_chars(m: Message) -> int:
    content = m.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return max(
            (len(str(p.get("text", ""))) for p in content if isinstance(p, dict)),
            default=0,
        )
    return 0
