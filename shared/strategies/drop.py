"""DropOldest: the last resort, deleting the oldest turn groups with a one-line marker."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate

from shared.messages import Message, groups
from shared.strategies.work import SYNTHETIC, Work

MARKER_TAG = "were dropped here to fit the context window]"


def drop_marker(messages: int, turn_groups: int) -> Message:
    """The note that tells the model something is missing."""
    return {
        "role": "user",
        "content": f"[{messages} earlier messages ({turn_groups} turns) {MARKER_TAG}",
    }


class DropOldest:
    """Delete the oldest turn groups until it fits (never the head, a summary or the tail)."""

    def __repr__(self) -> str:
        return "DropOldest()"

    async def apply(self, work: Work) -> None:
        origin, head, tail = work.origin, work.head_end, work.tail_start
        # a group's origins are contiguous, and prefit's own messages (-1) stand alone
        spans = [
            tuple(origin[a:b])
            for a, b in groups(work.messages)
            if origin[a] >= head and origin[a] != SYNTHETIC and origin[b - 1] < tail
        ]
        if not spans:
            return
        before = work.tokens()
        size = dict(zip(work.origin, map(work.size, work.messages), strict=True))
        # per-message sizes are raw estimates; scale them to the calibrated, pressured measure
        scale = before / max(1, sum(size.values()))
        dropped = list(accumulate((sum(size[o] for o in span) for span in spans), initial=0))
        take = first_guess(dropped.__getitem__, len(spans), scale, before - work.limits.target)
        _drop(work, spans[:take])
        while take < len(spans) and not work.fits_target():
            _drop(work, spans[take : take + 1])
            take += 1
        work.record("DropOldest", before, groups=work.dropped_groups)


def first_guess(dropped: Callable[[int], int], count: int, scale: float, excess: int) -> int:
    """How many of `count` oldest groups to drop at once: the fewest whose raw size (summed by
    `dropped(k)` over the first k), times `scale`, covers `excess`; all of them if none does.

    A guess from per-message sizes, refined by measuring; a bisection, so a ledger that knows
    the sums in O(1) makes the same guess in O(log n).
    """
    covered = bisect_left(range(count + 1), True, key=lambda k: scale * dropped(k) >= excess)
    return min(covered, count)


def _drop(work: Work, spans: list[tuple[int, ...]]) -> None:
    """Remove the groups whose original indices are `spans`, keeping one marker in their place."""
    gone = {o for span in spans for o in span}
    work.dropped_groups += len(spans)
    work.dropped_messages += len(gone)
    marker = drop_marker(work.dropped_messages, work.dropped_groups)
    messages: list[Message] = []
    origin: list[int] = []
    placed = False
    for m, o in zip(work.messages, work.origin, strict=True):
        is_marker = o == SYNTHETIC and MARKER_TAG in str(m.get("content"))
        if is_marker or o in gone:
            if not placed:
                messages.append(marker)
                origin.append(SYNTHETIC)
                placed = True
            continue
        messages.append(m)
        origin.append(o)
    work.replace(messages, origin)
