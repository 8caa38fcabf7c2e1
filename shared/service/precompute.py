"""Summaries ahead of time: what one summary job does, whoever runs it (a Celery task, a test).

`run_job` takes the conversation's lease (one summarizer at a time per conversation, across
every worker), then reads the transcript and its summary book, asks the policy which record is
due (`ContextPolicy.plan_summary`), folds only the new range into the best previous record
(`build_record`, chunk by chunk) and writes it with SET NX. Reading under the lease means a
duplicate that gets the lease after the holder finished plans nothing and calls no LLM.

A job that finds the lease held ends at once as `busy`, reading nothing. That is safe because
the holder, once it has written and released, checks whether the conversation changed while
it worked and, if so, goes round again: whatever the duplicate would have planned on is
either what the holder just summarized or a change the holder sees. Fifty triggers at once
thus cost one LLM call per range, forty-nine SET NX attempts, and no worker waits on a lease.

Nothing here logs message text: ids, hashes, counts and sizes only.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from shared.counting.calibration import NO_MODEL, CalibratedCounter
from shared.counting.counters import HeuristicCounter
from shared.counting.protocol import MessageCounter
from shared.errors import LeaseLost, StoreUnavailable
from shared.logs import get_logger
from shared.policy import ContextPolicy, SummaryPlan
from shared.service.jobs import SummaryJob
from shared.service.outcomes import FINAL, JobOutcome, Progress, Status
from shared.service.windows import service_policy
from shared.settings import Settings
from shared.store import BreakerState, Claim, HeldLease, Range, Store, Ticket
from shared.store.blocks import origin
from shared.store.breaker import CLOSED
from shared.store.conversations import Conversation, ConversationMeta
from shared.summaries.incremental import Built, build_record
from shared.summaries.summarizers import Summarizer

# Rounds of (plan, lease, write) per job: a conversation growing while its summary is made
# gets the next record from the same job, but a job never loops for ever on a busy stream.
MAX_ROUNDS = 4

# One process-wide base counter: its per-message cache is shared by every task thread.
_BASE_COUNTER = HeuristicCounter()

log = get_logger(__name__)

__all__ = ["JobOutcome", "Progress", "counter_for", "policy_for", "run_job"]


def counter_for(store: Store, tenant: str, model: str | None) -> MessageCounter:
    """The API's counter (heuristic, calibrated by the tenant's Redis ratio of the model),
    read once per job."""
    return CalibratedCounter(_BASE_COUNTER, ratios=store.ratios.of(tenant)).scaled(model)


def policy_for(job: SummaryJob, settings: Settings, counter: MessageCounter) -> ContextPolicy:
    """The policy the API used to enqueue `job`: the job's window, the settings' thresholds."""
    return service_policy(settings, job.max_input_tokens, job.reserve_output, counter)


async def run_job(
    job: SummaryJob,
    *,
    store: Store,
    summarizer: Summarizer,
    settings: Settings,
    owner: str,
    counter: MessageCounter | None = None,
    ticket: Ticket | None = None,
    provider: str | None = None,
    progress: Progress | None = None,
) -> JobOutcome:
    """Write the summary records `job`'s conversation needs now, if any (see `JobOutcome`).

    `ticket`: the job's in-flight entry, registered with each lease and removed with its
    release (`shared.store.inflight`); `provider`: the summarizer's breaker id (None: no
    breaker); `progress`: filled in with the range being summarized.

    Raises what the summarizer raises (`RetryableLLMError`, `LLMError`, ...), `LeaseLost`
    when the lease was lost mid-summary (nothing is written then) and `StoreUnavailable`.
    """
    ctx = {"tenant": job.tenant, "conversation_id": job.conversation_id, "owner": owner}
    runner = _Runner(job, store, summarizer, settings, owner, counter, ctx)
    runner.ticket, runner.provider = ticket, provider
    runner.progress = progress if progress is not None else Progress()
    outcome = await runner.run()
    log.debug("summary.job_finished", **ctx, **outcome.to_dict())
    return outcome


class _Runner:
    """One job's rounds, with the running totals of what they cost."""

    def __init__(
        self,
        job: SummaryJob,
        store: Store,
        summarizer: Summarizer,
        settings: Settings,
        owner: str,
        counter: MessageCounter | None,
        ctx: dict[str, Any],
    ) -> None:
        self.job, self.store, self.summarizer = job, store, summarizer
        self.settings, self.owner, self.ctx = settings, owner, ctx
        self.counter = counter
        self.policy: ContextPolicy | None = None  # built on first use: a busy job needs none
        self.total = JobOutcome("not_due")
        self.ticket: Ticket | None = None
        self.provider: str | None = None
        self.breaker = CLOSED  # the summarizer's breaker as the last claim found it
        self.progress = Progress()

    async def run(self) -> JobOutcome:
        tenant, conv_id = self.job.tenant, self.job.conversation_id
        for round_ in range(MAX_ROUNDS):
            # the lease and, if taken, everything the round plans on: one round trip
            first_plan = self.policy is None and self.counter is None
            known = self.store.breakers.known(self.provider) if self.provider else None
            claim = self.store.claims.claim(
                tenant,
                conv_id,
                self.owner,
                self.settings.lease_ttl_s,
                ratio_of=(self.job.model or NO_MODEL) if first_plan else None,
                ticket=self.ticket,
                provider=self.provider if known is None else None,
            )
            held = claim.held
            if held is None:
                return self._busy(claim.holder)
            self.breaker = known if known is not None else claim.breaker
            if known is None and self.provider is not None:
                self.store.breakers.remember(self.provider, claim.breaker)
            with held:
                status, seen = await self._round(claim, held, first=round_ == 0)
                done = status in FINAL or seen is None
                # released, then the conversation looked at again: one round trip
                now = self._release(held, read=not done)
            if done or seen is None or not _changed(seen, now):
                break
        return self.total

    def _release(self, held: HeldLease, *, read: bool) -> ConversationMeta | None:
        if read:
            return self.store.claims.release(held)
        with contextlib.suppress(StoreUnavailable):  # the job is over: a lease left expires
            self.store.claims.release(held, read=False)
        return None

    def _ended(self, status: Status) -> Status:
        """End the job on `status`, unless an earlier round of it wrote a record."""
        self.total = replace(
            self.total, status=status if self.total.records == 0 else self.total.status
        )
        return status

    def _busy(self, holder: str | None) -> JobOutcome:
        log.debug("summary.busy", **self.ctx, holder=holder)
        status: Status = "busy" if self.total.records == 0 else self.total.status
        return replace(self.total, status=status, holder=holder)

    async def _round(
        self, claim: Claim, held: HeldLease, *, first: bool
    ) -> tuple[Status, ConversationMeta | None]:
        """Under the lease: plan on what `claim` read (a duplicate may just have finished),
        build, write."""
        conv, book = claim.conversation, claim.book
        if conv is None or book is None:
            log.debug("summary.conversation_gone", **self.ctx)
            return self._ended("stale_job"), None
        if first and not _starts_with(conv, self.job):
            self.total = replace(self.total, prefix_changed=True)
            log.info(
                "summary.prefix_changed",
                **self.ctx,
                job_length=self.job.length,
                length=conv.meta.length,
            )
        if self.policy is None:
            counter = self.counter or _scaled(claim.ratio, self.job.model)
            self.policy = policy_for(self.job, self.settings, counter)
        plan = self.policy.plan_summary(
            conv.messages,
            model=self.job.model,
            book=book,
            extra_tokens=self.job.extra_tokens,
            hashes=conv.hashes,
        )
        if plan is None:
            log.debug("summary.not_due", **self.ctx, length=conv.meta.length)
            return "not_due", conv.meta
        tenant, conv_id = self.job.tenant, self.job.conversation_id
        rng = Range(origin(plan.previous), plan.cut, plan.prefix_hash)
        existing = self.store.records.get(tenant, plan.prefix_hash)
        if existing is not None and existing.upto == plan.cut:
            held.check()
            self.store.records.put(tenant, conv_id, existing)
            log.debug("summary.linked", **self.ctx, upto=plan.cut, prefix_hash=plan.prefix_hash)
            self._tally("exists", plan, None, wrote=False)
            return "exists", conv.meta
        if claim.blocked == rng.origin:
            log.debug("summary.blocked", **self.ctx, upto=plan.cut, prefix_hash=plan.prefix_hash)
            return self._ended("blocked"), conv.meta
        if not self._may_call(self.breaker):
            log.debug("summary.breaker_open", **self.ctx, until=self.breaker.until)
            return self._ended("breaker_open"), conv.meta
        self.progress.range = rng
        status = await self._build(held, conv, plan, self.policy.counter)
        self.progress.range = None  # written: a later failure is not this range's
        if self.progress.probing and self.provider is not None:
            self.store.breakers.reset(self.provider)
            self.progress.probing = False
            log.warning("summarizer.breaker_closed", **self.ctx, provider=self.provider)
        return status, conv.meta

    def _may_call(self, breaker: BreakerState) -> bool:
        """Closed: yes; open: no; half-open: only the one job that gets the probe."""
        if breaker.state == "closed" or self.progress.probing:
            return True
        if breaker.state == "open" or self.provider is None:
            return False
        s = self.settings
        ttl = s.summarizer_timeout_s * max(1, s.summarizer_max_attempts) + s.lease_ttl_s
        self.progress.probing = self.store.breakers.probe(self.provider, ttl)
        if self.progress.probing:
            log.info("summarizer.breaker_probing", **self.ctx, provider=self.provider)
        return self.progress.probing

    def _summary_tokens(self) -> int:
        """The summarizer's cap for the window the job plans for (`max_summary_tokens` at most)."""
        if self.policy is None:
            return self.settings.max_summary_tokens
        return self.policy.summarize_params.summary_tokens(self.policy.budget(self.job.model))

    def _index_tokens(self) -> int:
        """The artifact index's share of the record, for the window the job plans for."""
        if self.policy is None:
            return 0
        return self.policy.summarize_params.index_tokens(self.policy.budget(self.job.model))

    async def _build(
        self, held: HeldLease, conv: Conversation, plan: SummaryPlan, counter: MessageCounter
    ) -> Status:
        started = time.perf_counter()
        built = await build_record(
            conv.messages,
            start=plan.start,
            cut=plan.cut,
            previous=plan.previous,
            summarizer=self.summarizer,
            counter=counter,
            model=self.job.model,
            chunk_tokens=self.settings.chunk_tokens,
            max_summary_tokens=self._summary_tokens(),
            hashes=conv.hashes,
            index_tokens=self._index_tokens(),
        )
        tenant, conv_id = self.job.tenant, self.job.conversation_id
        spent = (built.input_tokens, built.output_tokens)
        try:
            held.check()
        except LeaseLost:
            # The summary was made and paid for: counted, though nothing is written.
            self.store.usage.add(tenant, *spent, built.cost, summaries=1)
            log.warning(
                "summary.lease_lost",
                **self.ctx,
                upto=plan.cut,
                calls=built.calls,
                input_tokens=spent[0],
                output_tokens=spent[1],
            )
            raise
        # Counted before the write, in the same round trip: the summary was made and paid
        # for, whatever becomes of the record (a racing writer, Redis failing on the write).
        wrote = self.store.claims.commit(tenant, conv_id, built.record, (*spent, built.cost))
        status: Status = "written" if wrote else "exists"
        self._tally(status, plan, built, wrote)
        log.debug(
            "summary.computed" if wrote else "summary.raced",
            **self.ctx,
            start=plan.start,
            previous_upto=plan.previous.upto if plan.previous is not None else None,
            upto=plan.cut,
            prefix_hash=plan.prefix_hash,
            calls=built.calls,
            input_tokens=spent[0],
            output_tokens=spent[1],
            cost=built.cost,
            summary_tokens=built.record.tokens,
            summarizer=built.record.summarizer,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return status

    def _tally(self, status: Status, plan: SummaryPlan, built: Built | None, wrote: bool) -> None:
        t = self.total
        self.total = replace(
            t,
            status="written" if "written" in (status, t.status) else status,
            upto=plan.cut,
            prefix_hash=plan.prefix_hash,
            records=t.records + (1 if wrote else 0),
            calls=t.calls + (built.calls if built else 0),
            input_tokens=t.input_tokens + (built.input_tokens if built else 0),
            output_tokens=t.output_tokens + (built.output_tokens if built else 0),
            cost=t.cost + (built.cost if built else 0.0),
        )


def _changed(seen: ConversationMeta, now: ConversationMeta | None) -> bool:
    """Whether the conversation changed since `seen` (`now`: read after the lease's release).

    A duplicate that found the lease held ended trusting this check: anything it would have
    planned on is either what was just summarized, or a change seen here.
    """
    return now is not None and (now.length, now.updated_at) != (seen.length, seen.updated_at)


class _ReadRatio:
    """The calibration ratio `claim` read with the lease, as a read-only `RatioStore`."""

    def __init__(self, ratio: float | None) -> None:
        self._ratio = ratio

    def get(self, model: str) -> float | None:
        return self._ratio

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        raise NotImplementedError("workers do not calibrate")


def _scaled(ratio: float | None, model: str | None) -> MessageCounter:
    """`counter_for` with the ratio already read (clamped the same way)."""
    return CalibratedCounter(_BASE_COUNTER, ratios=_ReadRatio(ratio)).scaled(model)


def _starts_with(conv: Conversation, job: SummaryJob) -> bool:
    """True if the stored transcript still starts with the prefix the job was planned on."""
    return job.length < len(conv.hashes) and conv.hashes[job.length] == job.prefix_hash
