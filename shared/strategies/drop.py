"""DropOldest: the last resort, deleting the oldest turn groups with a one-line marker."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate

from shared.messages import Message, groups, is_request
from shared.strategies.origins import SYNTHETIC
from shared.strategies.work import Work

MARKER_TAG = "were dropped here to fit the context window]"
_MARKER = re.compile(r"\[(\d+) earlier messages \((\d+) turns\) " + re.escape(MARKER_TAG))


def drop_marker(messages: int, turn_groups: int) -> Message:
    """The note that tells the model something is missing."""
    return {
        "role": "user",
        "content": f"[{messages} earlier messages ({turn_groups} turns) {MARKER_TAG}",
    }


# The user's latest message outside the protected tail is kept when it is at most this
# share of the target: it says what the turns after it are doing (an agent may make dozens
# of tool calls after a follow-up request); a larger one (a pasted log) may go.
PIN_MAX_SHARE = 0.25


class DropOldest:
    """Delete the oldest turn groups until it fits (never the head, a summary or the tail,
    nor the user's latest message: see `PIN_MAX_SHARE`). A thinking turn goes whole or not
    at all (shared/messages.py): it is one unit, and one the tail starts inside is kept.

    Each run of dropped groups leaves one marker saying how much is missing there (one run,
    right after the head, unless a cut-able gap or template before the task was dropped too,
    or the user's latest message or a request the head keeps in the template stands between
    two runs).
    """

    def __repr__(self) -> str:
        return "DropOldest()"

    async def apply(self, work: Work) -> None:
        work.align()
        spans = droppable(work)
        if not spans:
            return
        before = work.tokens()
        base, origin = work.messages, work.origin
        sizes = [work.size(m) for m in base]
        # per-message sizes are raw estimates; scale them to the calibrated, pressured measure
        scale = before / max(1, sum(sizes))
        dropped = list(accumulate((sum(sizes[a:b]) for a, b in spans), initial=0))
        take = first_guess(dropped.__getitem__, len(spans), scale, before - work.limits.target)
        drop_runs(work, base, origin, spans[:take])
        while take < len(spans) and not work.fits_target():
            take += 1
            drop_runs(work, base, origin, spans[:take])
        work.dropped_groups += take
        work.dropped_messages += sum(b - a for a, b in spans[:take])
        work.record("DropOldest", before, groups=work.dropped_groups)


def droppable(work: Work) -> list[tuple[int, int]]:
    """Positions `[a, b)` of the units that may go, oldest first: turn groups, those of a
    thinking turn together; before the protected tail and the thinking turn it starts
    inside (`Work.bound`), nothing protected in them, and none of prefit's own messages
    (summary, marker)."""
    origin, bound, inside = work.origin, work.bound, work.inside()
    end = next((p for p, o in enumerate(origin) if o >= bound), len(origin))
    pin = pinned(work, end)
    units: list[list[int]] = []  # [a, b, may go]
    for a, b in groups(work.messages):
        if b > end:
            break
        free = a != pin and all(
            origin[p] != SYNTHETIC and not work.protected(p) for p in range(a, b)
        )
        if origin[a] >= 0 and inside[origin[a]] >= 0:  # within the thinking turn before
            if not units:  # one that began before the head's end: it stays
                units.append([a, b, 0])
            units[-1][1] = b
            units[-1][2] &= free
        else:
            units.append([a, b, free])
    return [(a, b) for a, b, free in units if free]


def latest_request(transcript: Sequence[Message], head_end: int, tail: int) -> int | None:
    """Index of the transcript's last request (`is_request`) when it stands in
    `[head_end, tail)`."""
    for i in range(len(transcript) - 1, head_end - 1, -1):
        if is_request(transcript[i]):
            return i if i < tail else None
    return None


def pin_fits(size: int, target: int) -> bool:
    """Whether a latest request of `size` raw tokens is kept (see `PIN_MAX_SHARE`)."""
    return size <= PIN_MAX_SHARE * target


def pinned(work: Work, end: int) -> int | None:
    """Position in `work.messages[:end]` of the user's latest message that `DropOldest` keeps."""
    found = latest_request(work.transcript, work.head_end, work.tail_start)
    if found is None:
        return None
    at = next((p for p in range(end) if work.origin[p] == found), None)
    if at is None or not pin_fits(work.size(work.messages[at]), work.limits.target):
        return None
    return at


def first_guess(dropped: Callable[[int], int], count: int, scale: float, excess: int) -> int:
    """How many of `count` oldest groups to drop at once: the fewest whose raw size (summed by
    `dropped(k)` over the first k), times `scale`, covers `excess`; all of them if none does.

    A guess from per-message sizes, refined by measuring; a bisection, so a ledger that knows
    the sums in O(1) makes the same guess in O(log n).
    """
    covered = bisect_left(range(count + 1), True, key=lambda k: scale * dropped(k) >= excess)
    return min(covered, count)


def drop_runs(
    work: Work, base: Sequence[Message], origin: Sequence[int], spans: list[tuple[int, int]]
) -> None:
    """`base` without the groups at `spans`, one marker standing for each run of them (an
    earlier marker next to a run is folded into it)."""
    gone = {p for a, b in spans for p in range(a, b)}
    starts = {a for a, _ in spans}
    messages: list[Message] = []
    kept: list[int] = []
    run: list[int] | None = None  # [messages, groups] of the run being dropped
    for p, m in enumerate(base):
        counts = marker_counts(m) if origin[p] == SYNTHETIC else None
        if p in gone or counts is not None:
            run = run or [0, 0]
            extra = counts or (1, 1 if p in starts else 0)
            run[0] += extra[0]
            run[1] += extra[1]
            continue
        if run is not None:
            _place(messages, kept, run)
            run = None
        messages.append(m)
        kept.append(origin[p])
    if run is not None:
        _place(messages, kept, run)
    work.replace(messages, kept)


def _place(messages: list[Message], kept: list[int], run: list[int]) -> None:
    messages.append(drop_marker(run[0], run[1]))
    kept.append(SYNTHETIC)


def marker_counts(m: Message) -> tuple[int, int] | None:
    """(messages, groups) a drop marker stands for; None for any other message."""
    content = m.get("content")
    if not isinstance(content, str):
        return None
    match = _MARKER.fullmatch(content)
    return (int(match[1]), int(match[2])) if match else None
