"""The cut: a conversation's ledger of sizes, and the default strategies decided on its sums.

`prepare` with the default strategies reduces a transcript position by position (a tool
result shortened, a tool result cleared) and then drops whole turn groups from the oldest.
Every one of those steps is a sum over a range of per-message sizes, so a `Ledger` that keeps
prefix sums of the sizes each message would have at each step lets `Shortcut` decide the
whole pipeline with a few bisections, in O(log n) plus what is kept, and build only the
messages it keeps.

A ledger is only ever extended from messages that `ValidatedPrefixes` has just matched or
checked for its conversation (under its lock): the positions it covers are equal, by
content, to the transcript it is used with. It holds numbers and positions, never text.

`ContextPolicy.prepare` takes this path when its strategies are the default four and the
summary step can do nothing (no summarizer, no record in the book); anything else runs the
strategies themselves. The result is the one running `TruncateToolResults`,
`ClearToolResults`, `Summarize` and `DropOldest` in order would give, message for message and
figure for figure (tests/shared/test_cut.py replays real transcripts through both): each step
mirrors one strategy, measuring as `Work.tokens` does. `DropOldest` drops the oldest turn
groups between the head and the protected tail, but the user's latest request there
(`Frame.pin`, see `PIN_MAX_SHARE`): at most two runs, each standing behind one marker, as the
strategy leaves them. A thinking turn (shared/messages.py) is one unit: the ledger keeps the
group starts a cut may fall at (`Ledger.cuts`), and the drop ends where the protected tail
starts, or at the start of the thinking turn the tail starts inside (`Frame.bound`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.counting.calibration import CalibratedCounter, ScaledCounter, scale
from shared.counting.counters import CachedCounter
from shared.counting.protocol import MessageCounter
from shared.messages import Message, ToolSpec, groups, is_request, tail_start, thinking_turns
from shared.strategies import (
    ClearToolResults,
    DropOldest,
    Strategy,
    Summarize,
    TruncateToolResults,
)
from shared.strategies.drop import drop_marker, first_guess, pin_fits
from shared.strategies.work import check_pressure, counter_parts


@dataclass(frozen=True)
class Steps:
    """What per-message facts depend on: the counter and the two per-message strategies."""

    base: CachedCounter
    truncate: TruncateToolResults
    clear: ClearToolResults

    def signature(self) -> tuple[object, ...]:
        """The strategy settings per-message facts depend on (the counter is compared by
        identity)."""
        t, c = self.truncate, self.clear
        return (t.max_chars, t.head, c.placeholder)


class Ledger:
    """Prefix sums of message sizes as sent, after truncation, and saved by clearing.

    `cum_raw[i]`, `cum_short[i]` and `cum_saved[i]` sum messages `[0, i)`: their sizes, their
    sizes after `TruncateToolResults`, and what `ClearToolResults` would save on each
    clearable tool result (size truncated minus size cleared). Position lists are sorted.
    """

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.signature = steps.signature()
        # machine integers, 8 bytes an entry: a ledger per conversation must stay small
        self.cum_raw = array("q", [0])
        self.cum_short = array("q", [0])
        self.cum_saved = array("q", [0])
        self.tools = array("q")  # tool results
        self.shortened = array("q")  # tool results TruncateToolResults changes
        self.clearable = array("q")  # tool results ClearToolResults may replace
        self.starts = array("q")  # turn groups
        self.cuts = array("q")  # turn groups a cut may start at: not inside a thinking turn
        self.requests = array("q")  # the person's requests (`is_request`)
        self.inside = array("q")  # per message, the thinking turn it lies inside (-1: none)
        self.opened = -1  # the thinking turn open after the last message (-1: none)

    def __len__(self) -> int:
        return len(self.cum_raw) - 1

    def fits(self, steps: Steps) -> bool:
        """Whether this ledger was built with the same counter and strategy settings."""
        return steps.signature() == self.signature and steps.base is self.steps.base

    def extend(self, messages: Sequence[Message]) -> None:
        """Take in `messages[len(self):]` (the earlier ones are the ones already taken in)."""
        start = len(self)
        if start >= len(messages):
            return
        base, placeholder = self.steps.base, self.steps.clear.placeholder
        sizes = base.message_counts(messages[start:])
        for i, size in enumerate(sizes, start):
            m = messages[i]
            self.cum_raw.append(self.cum_raw[-1] + size)
            if is_request(m):
                self.requests.append(i)
            if m.get("role") != "tool":
                self.cum_short.append(self.cum_short[-1] + size)
                self.cum_saved.append(self.cum_saved[-1])
                continue
            self.tools.append(i)
            short = self.steps.truncate.shorten(m)
            if short is not None:
                self.shortened.append(i)
                size = base.count_message(short)
            self.cum_short.append(self.cum_short[-1] + size)
            saved = 0
            if (short or m).get("content") != placeholder:
                self.clearable.append(i)
                saved = size - base.count_message({**m, "content": placeholder})
            self.cum_saved.append(self.cum_saved[-1] + saved)
        inside, self.opened = thinking_turns(messages, start, self.opened)
        self.inside.extend(inside)
        self._regroup(messages)

    def _regroup(self, messages: Sequence[Message]) -> None:
        """Group starts up to the end: only the last group can have grown."""
        last = self.starts.pop() if self.starts else 0
        if self.cuts and self.cuts[-1] == last:
            self.cuts.pop()
        new = [a for a, _ in groups(messages, last)]
        self.starts.extend(new)
        inside = self.inside
        self.cuts.extend(a for a in new if inside[a] < 0)

    # --- queries, for a transcript of the first `n` positions --------------------------
    def tool_count(self, n: int) -> int:
        return bisect_left(self.tools, n)

    def shortened_in(self, a: int, b: int) -> array[int]:
        """Positions in `[a, b)` that truncation changes."""
        s = self.shortened
        return s[bisect_left(s, a) : bisect_left(s, b)]

    def clearable_in(self, a: int, b: int) -> array[int]:
        """Positions in `[a, b)` that clearing may replace."""
        c = self.clearable
        return c[bisect_left(c, a) : bisect_left(c, b)] if a < b else array("q")

    def last_request(self, n: int) -> int | None:
        """Position of the last request among the first `n`, None if there is none."""
        k = bisect_left(self.requests, n)
        return self.requests[k - 1] if k else None

    def bound(self, tail: int) -> int:
        """`tail`, or the start of the thinking turn position `tail` lies inside."""
        inside = self.inside
        return inside[tail] if tail < len(inside) and inside[tail] >= 0 else tail

    def cut_starts(self, a: int, b: int) -> array[int]:
        """Starts of the turn groups in `[a, b)` a cut may start at (`cuts`)."""
        c = self.cuts
        return c[bisect_left(c, a) : bisect_left(c, b)]

    def group_starts(self, a: int, b: int) -> array[int]:
        """Starts of the turn groups that start in `[a, b)`."""
        s = self.starts
        return s[bisect_left(s, a) : bisect_left(s, b)]


def grow(steps: Steps, ledger: Ledger | None, messages: list[Message]) -> Ledger:
    """`ledger` extended to `messages`, or a new one when it was built differently."""
    if ledger is None or not ledger.fits(steps):
        ledger = Ledger(steps)
    ledger.extend(messages)
    return ledger


@dataclass(frozen=True)
class TokenScale:
    """Tokens of a prompt whose messages sum to `raw`: plus tools and priming, calibrated,
    scaled by 1/pressure (what `Work.tokens` computes)."""

    fixed: int
    ratio: float
    pressure: float

    def __post_init__(self) -> None:
        check_pressure(self.pressure)  # 5e-324 would make every size infinite

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
    pin: int = -1  # the user's latest request, which `DropOldest` keeps (-1: none)
    bound: int = -1  # where what may be dropped ends (`Ledger.bound` of `tail`)


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


def note_step(out: Outcome, strategy: str, tokens: int, **detail: Any) -> None:
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


def drop(frame: Frame, steps: Steps, measure: TokenScale, raw: int, out: Outcome) -> None:
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
    note_step(out, "DropOldest", tokens, groups=take)


@dataclass(frozen=True)
class Runs:
    """The units `DropOldest` may drop, oldest first: those in [head, bound) (a thinking
    turn's groups as one) but the user's latest request (`pin`, -1 for none), itself one
    group."""

    starts: Sequence[int]
    tail: int
    pin: int
    before_pin: int  # droppable groups before the pin (all of them without one)
    count: int

    @classmethod
    def of(cls, frame: Frame) -> Runs:
        starts = frame.ledger.cut_starts(frame.head, frame.bound)
        pin = frame.pin
        before = bisect_left(starts, pin) if pin >= 0 else len(starts)
        return cls(starts, frame.bound, pin, before, len(starts) - (pin >= 0))

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
    steps: Steps, measure: TokenScale, left: int, runs: list[tuple[int, int, int]], out: Outcome
) -> int:
    """Tokens once the groups of `runs` are gone, leaving `left` raw tokens of messages, and
    a marker for each run says so."""
    out.dropped = [(a, b) for a, b, _ in runs]
    out.markers = [drop_marker(b - a, groups) for a, b, groups in runs]
    return measure(left + sum(map(steps.base.count_message, out.markers)))


_DEFAULT_KINDS = (
    [TruncateToolResults, ClearToolResults, Summarize, DropOldest],
    [TruncateToolResults, ClearToolResults, DropOldest],
)


def default_steps(strategies: list[Strategy], counter: MessageCounter) -> Steps | None:
    """The ledger's `Steps` when the strategies are the default ones (in their order, any
    settings) and the counter counts by content (calibrated or not: the ledger holds
    uncalibrated sizes); None: run the strategies themselves."""
    base = counter.base if isinstance(counter, CalibratedCounter | ScaledCounter) else counter
    if not isinstance(base, CachedCounter) or [type(s) for s in strategies] not in _DEFAULT_KINDS:
        return None
    truncate, clear = strategies[0], strategies[1]
    assert isinstance(truncate, TruncateToolResults) and isinstance(clear, ClearToolResults)
    return Steps(base, truncate, clear)


def can_decide(strategies: list[Strategy], policy_summarizer: object) -> bool:
    """Whether no summary step can call a model (then `decide` equals the strategies)."""
    own = [s.summarizer for s in strategies if isinstance(s, Summarize)]
    return policy_summarizer is None and all(o is None for o in own)


@dataclass(frozen=True)
class Shortcut:
    """The ledger path for one `prepare` call: the conversation's ledger and how to measure."""

    steps: Steps
    ledger: Ledger
    measure: TokenScale

    @classmethod
    def of(
        cls,
        steps: Steps | None,
        ledger: Ledger | None,
        counter: MessageCounter,
        tools: Sequence[ToolSpec],
        pressure: float,
    ) -> Shortcut | None:
        """The shortcut, when the strategies are the default ones and the ledger is current."""
        base, ratio = counter_parts(counter)
        if steps is None or ledger is None or base is not steps.base:
            return None
        return cls(
            steps, ledger, TokenScale(base.count_tools(tools) + base.priming, ratio, pressure)
        )

    def tokens(self, n: int) -> int:
        """Tokens of the transcript made of the ledger's first `n` messages, as it is."""
        return self.measure(self.ledger.cum_raw[n])

    def tail(self, head: int, n: int, keep_recent: int) -> int:
        """`ContextPolicy.regions`' tail start for the first `n` messages, the head ending
        at `head` (a group boundary, so the groups after it are the ledger's)."""
        return tail_start(self.ledger.group_starts(head, n), head, keep_recent)

    def pin(self, head: int, tail: int, n: int, target: int) -> int:
        """Where `DropOldest` finds the user's latest request it keeps (`pinned`); -1: none."""
        last = self.ledger.last_request(n)
        if last is None or not head <= last < tail:
            return -1
        cum = self.ledger.cum_raw
        return last if pin_fits(cum[last + 1] - cum[last], target) else -1

    def served(self, head: int, summary: Message, upto: int, n: int) -> int:
        """Tokens of the prompt [head][summary][messages upto..n) (what `with_best` builds)."""
        cum = self.ledger.cum_raw
        return self.measure(cum[head] + self.steps.base.count_message(summary) + cum[n] - cum[upto])

    def cut(
        self,
        transcript: list[Message],
        head: int,
        keep_recent: int,
        strategies: list[Strategy],
        book_given: bool,
        report: dict[str, Any],
        due: Callable[[], bool],
    ) -> list[Message] | None:
        """What the strategies leave of `transcript` (and `report` filled in as they would);
        None when it does not fit, for the strategies themselves to say by how much.

        `due` says whether the workers could write a record now: asked only when the
        summary step was reached with a book, as `Summarize` asks it.
        """
        starts = self.ledger.group_starts(head, len(transcript))
        tail = tail_start(starts, head, keep_recent)
        summarize_step = any(isinstance(s, Summarize) for s in strategies)
        target = report["target_tokens"]
        pin = self.pin(head, tail, len(transcript), target)
        bound = self.ledger.bound(tail)
        f = Frame(
            self.ledger, len(transcript), head, tail, target, summarize_step, book_given, pin, bound
        )
        out = decide(f, self.steps, self.measure)
        if out.tokens > report["budget"]:
            return None
        out.stale = out.stale and due()
        report.update(_report(f, out))
        return build(transcript, f, self.steps, out)


def decide(frame: Frame, steps: Steps, measure: TokenScale) -> Outcome:
    """Run the four steps on sums; stop after the first that brings it under target."""
    ledger, n = frame.ledger, frame.n
    raw = ledger.cum_raw[n]
    out = Outcome(tokens=measure(raw))
    shortened = len(ledger.shortened_in(0, n))
    if shortened:
        raw = ledger.cum_short[n]
        note_step(out, "TruncateToolResults", measure(raw), messages=shortened)
        out.truncated = True
    if out.tokens <= frame.target:
        return out
    until = _clear_until(frame, steps.clear.keep_last)
    cleared = len(ledger.clearable_in(frame.head, until))
    if cleared:
        raw -= ledger.cum_saved[until] - ledger.cum_saved[frame.head]
        note_step(out, "ClearToolResults", measure(raw), messages=cleared)
        out.cleared_until = until
    if out.tokens <= frame.target:
        return out
    if frame.summarize_step and frame.bound > frame.head:
        out.stale = frame.book_given
    drop(frame, steps, measure, raw, out)
    return out


def _clear_until(frame: Frame, keep_last: int) -> int:
    """End of the range whose tool results `ClearToolResults` replaces."""
    tools = frame.ledger.tool_count(frame.n)
    if tools <= keep_last:
        return frame.head
    if keep_last == 0:
        return frame.tail
    return min(frame.tail, frame.ledger.tools[tools - keep_last])


def _report(frame: Frame, out: Outcome) -> dict[str, Any]:
    """What `reports.outcome` says of the same cut."""
    gone = sum(b - a for a, b in out.dropped)
    return {
        "tokens_after": out.tokens,
        "applied": out.applied,
        "summary": None,
        "dropped_groups": out.dropped_groups,
        "dropped_messages": gone,
        "stale": out.stale,
        "changed": bool(out.applied),
    }


def build(transcript: list[Message], frame: Frame, steps: Steps, out: Outcome) -> list[Message]:
    """The messages the steps leave: fresh dicts for every one they changed (the head's tool
    results too, which `TruncateToolResults` shortens like any other)."""
    ledger, head = frame.ledger, frame.head
    out_messages = transcript[:head]
    placed = [(0, head, 0)]  # ranges of the transcript kept, and where each lands (offset)
    at = head
    for (a, b), marker in zip(out.dropped, out.markers, strict=True):
        placed.append((at, a, len(out_messages) - at))
        out_messages += transcript[at:a]
        out_messages.append(marker)
        at = b
    placed.append((at, frame.n, len(out_messages) - at))
    out_messages += transcript[at : frame.n]
    until = out.cleared_until
    for a, b, offset in placed:
        if out.truncated:
            for i in ledger.shortened_in(a, b):
                out_messages[i + offset] = steps.truncate.shorten(transcript[i]) or transcript[i]
        if until is not None:
            for i in ledger.clearable_in(max(a, head), min(b, until)):
                out_messages[i + offset] = {**transcript[i], "content": steps.clear.placeholder}
    return out_messages
