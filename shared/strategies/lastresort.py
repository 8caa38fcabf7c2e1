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
"""

from __future__ import annotations

import math
from typing import Any

from shared.messages import Message
from shared.strategies.truncate import TruncateToolResults
from shared.strategies.work import Work

FLOOR_CHARS = 1_000
NAME = "LastResortTruncate"
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
