"""The frame and outcome of the ledger's cut (shared/cut.py), and its `DropOldest` step.

`DropOldest` drops the oldest turn groups between the head and the protected tail, but the
user's latest message there (`Frame.pin`, see `PIN_MAX_SHARE`): at most two runs, each
standing behind one marker, as the strategy leaves them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.calibration import scale
from shared.ledger import Ledger, Steps
from shared.messages import Message
from shared.strategies.drop import drop_marker, first_guess


@dataclass(frozen=True)
class Measure:
    """Tokens of a prompt whose messages sum to `raw`: plus tools and priming, calibrated,
    scaled by 1/pressure (what `Work.tokens` computes)."""

    fixed: int
    ratio: float
    pressure: float

    def __call__(self, raw: int) -> int:
        value = scale(self.ratio, raw + self.fixed)
        return math.ceil(value / self.pressure) if self.pressure != 1.0 else value


@dataclass(frozen=True)
class Frame:
    """One transcript against one ledger: its length, head end and protected tail start."""

    ledger: Ledger
    n: int
    head: int
    tail: int
    target: int
    summarize_step: bool  # a (no-op) Summarize runs between clearing and dropping
    book_given: bool
    pin: int = -1  # the user's latest message, which `DropOldest` keeps (-1: none)


@dataclass
class Outcome:
    """What the steps decided: enough to build the messages and the report."""

    tokens: int
    applied: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False
    cleared_until: int | None = None  # clearable results in [head, this) are cleared
    dropped: list[tuple[int, int]] = field(default_factory=list)  # runs gone, each `[a, b)`
    dropped_groups: int = 0
    markers: list[Message] = field(default_factory=list)  # one standing for each run
    stale: bool = False


def record(out: Outcome, strategy: str, tokens: int, **detail: Any) -> None:
    out.applied.append({"strategy": strategy, "saved": out.tokens - tokens, **detail})
    out.tokens = tokens


def span_size(frame: Frame, out: Outcome, a: int, b: int) -> int:
    """Raw size of messages `[a, b)` as they stand after truncating and clearing."""
    ledger = frame.ledger
    size = (ledger.cum_short if out.truncated else ledger.cum_raw)[b]
    size -= (ledger.cum_short if out.truncated else ledger.cum_raw)[a]
    until = out.cleared_until
    if until is not None:
        size -= ledger.cum_saved[min(b, until)] - ledger.cum_saved[min(a, until)]
    return size


def drop(frame: Frame, steps: Steps, measure: Measure, raw: int, out: Outcome) -> None:
    """`DropOldest`: the first guess from sizes, then one more group until it fits."""
    runs = Runs.of(frame)
    if not runs.count:
        return
    before = out.tokens

    def dropped(k: int) -> int:  # raw size of the oldest k groups, as they are now
        return sum(span_size(frame, out, a, b) for a, b, _ in runs.first(k))

    take = first_guess(dropped, runs.count, before / max(1, raw), before - frame.target)
    tokens = _without(steps, measure, raw - dropped(take), runs.first(take), out)
    while take < runs.count and tokens > frame.target:
        take += 1
        tokens = _without(steps, measure, raw - dropped(take), runs.first(take), out)
    out.dropped_groups = take
    record(out, "DropOldest", tokens, groups=take)


@dataclass(frozen=True)
class Runs:
    """The groups `DropOldest` may drop, oldest first: those in [head, tail) but the
    user's latest message (`pin`, -1 for none), itself one group."""

    starts: Sequence[int]
    tail: int
    pin: int
    before_pin: int  # droppable groups before the pin (all of them without one)
    count: int

    @classmethod
    def of(cls, frame: Frame) -> Runs:
        starts = frame.ledger.group_starts(frame.head, frame.tail)
        pin = frame.pin
        before = bisect_left(starts, pin) if pin >= 0 else len(starts)
        return cls(starts, frame.tail, pin, before, len(starts) - (pin >= 0))

    def _end(self, k: int) -> int:  # where the oldest k >= 1 groups (pin included) end
        return self.starts[k] if k < len(self.starts) else self.tail

    def first(self, k: int) -> list[tuple[int, int, int]]:
        """The runs `[a, b)` of the oldest `k` droppable groups, with their group counts."""
        if not k:
            return []
        head = self.starts[0]
        if k <= self.before_pin:
            return [(head, self._end(k), k)]
        after = (self.pin + 1, self._end(k + 1), k - self.before_pin)
        return [(head, self.pin, self.before_pin), after] if self.before_pin else [after]


def _without(
    steps: Steps, measure: Measure, left: int, runs: list[tuple[int, int, int]], out: Outcome
) -> int:
    """Tokens once the groups of `runs` are gone, leaving `left` raw tokens of messages, and
    a marker for each run says so."""
    out.dropped = [(a, b) for a, b, _ in runs]
    out.markers = [drop_marker(b - a, groups) for a, b, groups in runs]
    return measure(left + sum(map(steps.base.count_message, out.markers)))
