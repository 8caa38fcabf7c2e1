"""Cut: the default strategies decided on a ledger's sums, in O(log n) plus what is kept.

`ContextPolicy.prepare` takes this path when its strategies are the default four and the
summary step can do nothing (no summarizer, no record in the book); anything else runs the
strategies themselves. The result is the one running `TruncateToolResults`,
`ClearToolResults`, `Summarize` and `DropOldest` in order would give, message for message and
figure for figure (tests/shared/test_cut.py replays real transcripts through both): each step
below mirrors one strategy, measuring as `Work.tokens` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.calibration import CalibratedCounter, ScaledCounter
from shared.counters import CachedCounter
from shared.counting import MessageCounter
from shared.cutdrop import Frame, Measure, Outcome, drop, record
from shared.ledger import Ledger, Steps
from shared.messages import Message, ToolSpec, tail_start
from shared.strategies import (
    ClearToolResults,
    DropOldest,
    Strategy,
    Summarize,
    TruncateToolResults,
)
from shared.strategies.drop import pin_fits
from shared.strategies.work import counter_parts

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
    measure: Measure

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
        return cls(steps, ledger, Measure(base.count_tools(tools) + base.priming, ratio, pressure))

    def tokens(self, n: int) -> int:
        """Tokens of the transcript made of the ledger's first `n` messages, as it is."""
        return self.measure(self.ledger.cum_raw[n])

    def tail(self, head: int, n: int, keep_recent: int) -> int:
        """`ContextPolicy.regions`' tail start for the first `n` messages, the head ending
        at `head` (a group boundary, so the groups after it are the ledger's)."""
        return tail_start(self.ledger.group_starts(head, n), head, keep_recent)

    def pin(self, head: int, tail: int, n: int, target: int) -> int:
        """Where `DropOldest` finds the user's latest message it keeps (`pinned`); -1: none."""
        last = self.ledger.last_user(n)
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
        f = Frame(self.ledger, len(transcript), head, tail, target, summarize_step, book_given, pin)
        out = decide(f, self.steps, self.measure)
        if out.tokens > report["budget"]:
            return None
        out.stale = out.stale and due()
        report.update(_report(f, out))
        return build(transcript, f, self.steps, out)


def decide(frame: Frame, steps: Steps, measure: Measure) -> Outcome:
    """Run the four steps on sums; stop after the first that brings it under target."""
    ledger, n = frame.ledger, frame.n
    raw = ledger.cum_raw[n]
    out = Outcome(tokens=measure(raw))
    shortened = len(ledger.shortened_in(0, n))
    if shortened:
        raw = ledger.cum_short[n]
        record(out, "TruncateToolResults", measure(raw), messages=shortened)
        out.truncated = True
    if out.tokens <= frame.target:
        return out
    until = _clear_until(frame, steps.clear.keep_last)
    cleared = len(ledger.clearable_in(frame.head, until))
    if cleared:
        raw -= ledger.cum_saved[until] - ledger.cum_saved[frame.head]
        record(out, "ClearToolResults", measure(raw), messages=cleared)
        out.cleared_until = until
    if out.tokens <= frame.target:
        return out
    if frame.summarize_step and frame.tail > frame.head:
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
