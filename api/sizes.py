"""A stored conversation's size against the trigger, after a write or on a read.

What it reports: tokens, effective tokens (head + best summary + the rest), state, and the
summary job scheduled when it nears the trigger (api/schedule.py).

After a write the numbers come from what the write script measured in the same call; when
it could not (the append landed after other writers', or the tally had to be dropped) they
come from a fresh read of the tip and the tally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api.deps import Services
from api.policies import Window
from api.schedule import JobScope, PendingJob
from api.views import View, known_tail_start, read_view
from shared.counting.calibration import ScaledCounter, scale
from shared.errors import NotFound
from shared.messages import ToolSpec
from shared.policy import State
from shared.store.writes import Written
from shared.summaries.book import SummaryRecord
from shared.summaries.incremental import summary_message

# (upto, head) -> base tokens of the first `upto` and of the first `head` messages
Cum = Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Sizes:
    """A stored conversation's size now, and where it stands against the trigger."""

    length: int
    tokens: int
    effective_tokens: int
    state: State
    best: SummaryRecord | None
    pending: PendingJob | None = None  # a summary job to send once the answer is out


@dataclass(frozen=True)
class Measure:
    """What sizing a conversation needs: its end, token total, head and best record."""

    length: int
    last_hash: str
    total: int
    head: int
    best: SummaryRecord | None
    cum: Cum


class Sizing:
    """Sizes of the conversations of the app's services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.base = svc.base

    def view(self, tenant: str, conv_id: str) -> View:
        """The conversation's tip and token total, as `read_view` reads it for this service."""
        return read_view(
            self.svc.tally,
            tenant,
            conv_id,
            counter=self.base,
            counter_id=self.svc.counter_id,
            keep_recent=self.svc.settings.keep_recent,
        )

    def after(
        self,
        tenant: str,
        conv_id: str,
        window: Window,
        scaled: ScaledCounter,
        tools: Sequence[ToolSpec],
        done: Written,
        head: int,
    ) -> Sizes:
        """Sizes after a write: from what the write measured, else from a fresh read."""
        if done.measured and done.total is not None:
            at: Cum = lambda upto, h: (done.tokens_upto, done.tokens_head)  # noqa: E731
            m = Measure(done.length, done.last_hash, done.total, head, done.best, at)
        else:
            m = self.measured(tenant, conv_id, self.view(tenant, conv_id))
        return self.sizes(tenant, conv_id, window, scaled, tools, m)

    def measured(self, tenant: str, conv_id: str, view: View) -> Measure:
        """The `Measure` of a conversation as `view` shows it (two more reads)."""
        if not view.exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        keep = self.svc.settings.keep_recent
        tail = known_tail_start(view.window, view.offset, view.head_end, keep) or view.head_end
        best = self.svc.store.records.best(tenant, conv_id, upto_max=tail)

        def at(upto: int, head: int) -> tuple[int, int]:
            found = self.svc.tally.at(tenant, conv_id, [upto, head])
            return found[0], found[1]

        return Measure(view.length, view.last_hash, view.total, view.head_end, best, at)

    def sizes(
        self,
        tenant: str,
        conv_id: str,
        window: Window,
        scaled: ScaledCounter,
        tools: Sequence[ToolSpec],
        m: Measure,
    ) -> Sizes:
        """Tokens, effective tokens and state in `window`; schedules the summary job if due."""
        extra = self.base.count([], tools, window.model)  # tool specs + priming
        tokens = scale(scaled.ratio, m.total + extra)
        effective = scale(scaled.ratio, self.effective(m) + extra)
        policy = self.svc.policies.get(window, scaled)
        state = policy.state(effective, window.model)
        scope = JobScope(tenant, conv_id, window, m.length, m.last_hash, tools)
        budget = policy.budget(window.model)
        pending = self.svc.scheduler.ahead(scope, state, effective, budget, m.best)
        return Sizes(m.length, tokens, effective, state, m.best, pending)

    def effective(self, m: Measure) -> int:
        """Base tokens of [head][summary][rest], as `ContextPolicy.effective_tokens` counts."""
        if m.best is None or m.best.upto <= m.head:
            return m.total
        upto_tokens, head_tokens = m.cum(m.best.upto, m.head)
        summary = self.base.count_message(summary_message(m.best, m.head))
        return m.total - upto_tokens + head_tokens + summary
