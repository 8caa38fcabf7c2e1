"""Prepare (stored and stateless) and observe. Prepare never calls an LLM.

The policy is built without a summarizer: it serves the best stored summary record, the
cheap strategies and DropOldest. When the report says a summary is due and not ready
(`stale`), the stored prepare asks the workers for it at high priority and may wait up to
`wait_ms` for it, polling the record index (one small Lua call per poll), then prepares
again. A stateless prepare needs Redis only for the calibration ratio and a summary of the
same prefix; without Redis it still answers, from the cheap strategies, marked `degraded`.

A stored prepare gives Redis half the request deadline to answer (api/deadline.py). If it
does not, or is down, and this process has the conversation cached, the answer is made from
that snapshot (and the last ratio and best record seen), marked `degraded`: it may miss
messages appended through other replicas meanwhile. Otherwise it is 503 `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from api.cache import Loaded
from api.deadline import clock_of, within
from api.deps import Services
from api.payloads import incoming, incoming_tools, prepared_body
from api.policies import Window
from api.requestlog import RequestLog
from api.schedule import JobScope, PendingJob
from api.schemas import ObserveRequest, PrepareRequest, PrepareStoredRequest
from shared.counting.calibration import ScaledCounter
from shared.errors import InvalidRequest, StoreUnavailable
from shared.hashing import prefix_hashes
from shared.logs import get_logger
from shared.messages import Message, ToolSpec, validate
from shared.policy import ContextPolicy, Prepared
from shared.service.windows import service_policy
from shared.summaries.book import SummaryBook, SummaryRecord

log = get_logger(__name__)

POLL_S = 0.025


@dataclass(frozen=True)
class Fitted:
    """A stored conversation's prompt to send now: the result, its report, a job to send."""

    prepared: Prepared
    report: dict[str, Any]
    pending: PendingJob | None


class Preparer:
    """The prepare and observe routes' logic, on the app's services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def stored(
        self,
        tenant: str,
        conv_id: str,
        req: PrepareStoredRequest,
        window: Window,
        rec: RequestLog,
        request: Request | None = None,
    ) -> tuple[bytes, PendingJob | None]:
        """The answer, and a scheduled summary job for the caller to send after it (if any)."""
        tools = incoming_tools(req.tools, format=req.format)
        loaded, best, counter, degraded = await self._stored_state(tenant, conv_id, window)
        preambles = (  # the tenant's memory of openings (shared/store/openings.py)
            self.svc.openings.cached(tenant, loaded.messages)
            if degraded
            else await self.svc.openings.preambles(
                self.svc.increments().client, tenant, loaded.messages
            )
        )
        wait = req.wait_ms if req.wait_ms is not None else self.svc.settings.default_wait_ms
        fitted = await self.fit(
            tenant,
            conv_id,
            loaded,
            best,
            tools,
            window,
            pressure=req.pressure,
            wait_ms=wait,
            rec=rec,
            counter=counter,
            degraded=degraded,
            request=request,
            preambles=preambles,
        )
        report = fitted.report
        body = prepared_body(
            fitted.prepared.messages,
            report["tokens_after"],
            report,
            format=req.format,
            loaded=loaded,
        )
        return body, fitted.pending

    async def fit(
        self,
        tenant: str,
        conv_id: str,
        loaded: Loaded,
        best: SummaryRecord | None,
        tools: list[ToolSpec],
        window: Window,
        *,
        pressure: float,
        wait_ms: int,
        rec: RequestLog,
        counter: ScaledCounter | None = None,
        degraded: bool = False,
        request: Request | None = None,
        preambles: frozenset[str] = frozenset(),
    ) -> Fitted:
        """The stored prepare of `loaded` (the conversation `conv_id` as stored) with `best`.

        Schedules a due summary (`Scheduler.stale`; the caller sends it) and waits up to
        `wait_ms` for it; never calls an LLM. `degraded`: Redis did not answer, `loaded`
        is this process's cached copy (nothing is asked for, nothing waited on).
        `preambles`: the tenant's learned preambles for this transcript.
        """
        if counter is None:
            counter = await self._counter(tenant, window.model)
        policy = self.svc.policies.get(window, counter).heading(preambles)
        _, tail = loaded.regions(policy)
        if best is not None and best.upto > tail:  # rare: a record past the protected tail
            best = None
            if not degraded:
                best = await run_in_threadpool(
                    self.svc.store.records.best, tenant, conv_id, upto_max=tail
                )
        named = (tenant, conv_id)
        prepared = await _prepare(policy, loaded, named, tools, window, best, pressure)
        report = _report(prepared)
        pending = None
        if report["stale"] and not degraded:
            scope = JobScope(tenant, conv_id, window, loaded.length, loaded.hashes[-1], tools)
            pending = await run_in_threadpool(self.svc.scheduler.stale, scope, report, best)
            if pending is not None:
                rec.enqueued = pending.kind
            newer = None
            if wait_ms > 0:
                clock = clock_of(request) if request is not None else None
                if clock is not None:  # the client asked to wait: not Redis being slow
                    clock.extend(wait_ms / 1000)
                if pending is not None:  # sent now: the wait is for its result
                    await run_in_threadpool(self.svc.scheduler.send, pending)
                    pending = None
                newer = await self._wait(tenant, conv_id, best, tail, wait_ms, rec)
            if newer is not None:
                prepared = await _prepare(policy, loaded, named, tools, window, newer, pressure)
                report = _report(prepared)
            if rec.waited_ms is not None:
                report["waited_ms"] = rec.waited_ms
        report["degraded"] = degraded
        _note(rec, report, degraded=degraded)
        return Fitted(prepared, report, pending)

    async def _stored_state(
        self, tenant: str, conv_id: str, window: Window
    ) -> tuple[Loaded, SummaryRecord | None, ScaledCounter, bool]:
        """The conversation, its best record and the tenant's counter, from Redis within
        half the deadline; else from this process's cache, degraded (True)."""
        limit = self.svc.settings.request_deadline_s / 2
        until = time.monotonic() + limit
        try:
            # the read is asyncio all the way down, so cancelling it at the limit ends it at
            # once: no task of its own is needed (`within` is, for work in a thread)
            async with asyncio.timeout(limit):
                loaded, best = await self.svc.cache.aload(tenant, conv_id, self.svc.increments())
            counter = await self._counter(tenant, window.model, until)
            return loaded, best, counter, False
        except (StoreUnavailable, TimeoutError) as exc:
            cached = self.svc.cache.peek(tenant, conv_id)
            if cached is None:
                if isinstance(exc, StoreUnavailable):
                    raise
                raise StoreUnavailable("redis did not answer in time") from exc
            last = self.svc.ratios.last_known(tenant, window.model)
            return cached[0], cached[1], self.svc.scaled_by(last), True

    async def stateless(
        self, tenant: str, req: PrepareRequest, window: Window, rec: RequestLog
    ) -> bytes:
        messages = validate(incoming(req.messages, format=req.format, system=req.system))
        tools = incoming_tools(req.tools, format=req.format)
        until = time.monotonic() + self.svc.settings.request_deadline_s / 2  # Redis's share
        degraded = False
        try:
            counter = await within(self._counter(tenant, window.model), until - time.monotonic())
        except (StoreUnavailable, TimeoutError):
            degraded = True
            counter = self.svc.scaled_by(self.svc.ratios.last_known(tenant, window.model))
        policy = service_policy(
            self.svc.settings, window.max_input_tokens, window.reserve_output, counter
        )
        best = None
        hashes = None
        if not degraded and self._over(policy, messages, tools, window, req.pressure):
            hashes = prefix_hashes(messages)
            try:
                found = self._same_prefix(tenant, policy, messages, hashes)
                best = await within(found, until - time.monotonic())
            except (StoreUnavailable, TimeoutError):
                degraded = True
        book = SummaryBook([best]) if best is not None else None
        prepared = await policy.prepare(
            messages,
            tools=tools,
            model=window.model,
            book=book,
            pressure=req.pressure,
            hashes=hashes,
        )
        report = _report(prepared)
        report["degraded"] = degraded
        _note(rec, report, degraded=degraded)
        return prepared_body(prepared.messages, report["tokens_after"], report, format=req.format)

    async def observe(self, tenant: str, req: ObserveRequest) -> None:
        """Fold the provider's count into the tenant's ratio of the model; an implausible one
        is refused (`ImplausibleObservation`, shared/counting/calibration.py), changing nothing."""
        messages = validate(incoming(req.messages, format=req.format, system=req.system))
        tools = incoming_tools(req.tools, format=req.format)
        await self.calibrate(tenant, req.model, messages, tools, req.actual_prompt_tokens)

    async def calibrate(
        self,
        tenant: str,
        model: str,
        sent: Sequence[Message],
        tools: Sequence[ToolSpec],
        actual_prompt_tokens: int,
        *,
        estimated: int | None = None,
    ) -> None:
        """Feed a provider's own prompt count for what was `sent` on `tenant`'s behalf into
        the tenant's ratio of `model` (the proxy's way in; `ImplausibleObservation` as
        `observe`). `estimated`: the uncalibrated estimate of `sent` when the caller has it
        (counting a large prompt again costs milliseconds)."""
        if estimated is None:
            estimated = self.svc.base.count(list(sent), list(tools), model)
        if estimated <= 0:
            raise InvalidRequest("nothing to calibrate on: the messages and tools count 0 tokens")
        observed = actual_prompt_tokens / estimated
        await run_in_threadpool(self.svc.ratios.observe, tenant, model, observed)

    async def record_for(
        self, tenant: str, window: Window, messages: list[Message], hashes: list[str]
    ) -> SummaryRecord | None:
        """The tenant's longest summary record for a prefix of `messages`, from any of its
        conversations (cut points in (head, tail]); `hashes` are their prefix hashes."""
        policy = self.svc.policies.get(window, self.svc.base)
        return await self._same_prefix(tenant, policy, messages, hashes)

    async def counter_for(self, tenant: str, model: str) -> ScaledCounter:
        """The counter a prepare of `model` for `tenant` measures with (its ratio read once,
        cached 1 s)."""
        return await self._counter(tenant, model)

    # --- helpers -------------------------------------------------------------------------
    async def _counter(self, tenant: str, model: str, until: float | None = None) -> ScaledCounter:
        """The request's counter: the tenant's ratio of the model read once (from the 1 s
        cache if fresh); `TimeoutError` if Redis has not answered by `until` (monotonic)."""
        if self.svc.ratios.fresh(tenant, model):
            return self.svc.scaled(tenant, model)
        read = run_in_threadpool(self.svc.scaled, tenant, model)
        if until is None:
            scaled: ScaledCounter = await read
            return scaled
        return await within(read, until - time.monotonic())

    async def _wait(
        self,
        tenant: str,
        conv_id: str,
        best: SummaryRecord | None,
        tail: int,
        wait_ms: int,
        rec: RequestLog,
    ) -> SummaryRecord | None:
        """Poll the record index until a record newer than `best` appears, or `wait_ms` pass."""
        started = time.monotonic()
        deadline = started + wait_ms / 1000
        newer = None
        while newer is None and time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            found = await run_in_threadpool(
                self.svc.store.records.best, tenant, conv_id, upto_max=tail
            )
            if found is not None and (best is None or found.upto > best.upto):
                newer = found
        rec.waited_ms = round((time.monotonic() - started) * 1000, 1)
        return newer

    @staticmethod
    def _over(
        policy: ContextPolicy,
        messages: list[Message],
        tools: list[ToolSpec],
        window: Window,
        pressure: float,
    ) -> bool:
        raw = policy.counter.count(messages, tools, window.model)
        return raw / pressure > policy.trigger * policy.budget(window.model)

    async def _same_prefix(
        self, tenant: str, policy: ContextPolicy, messages: list[Message], hashes: list[str]
    ) -> SummaryRecord | None:
        """A record of the tenant's for a prefix of `messages` (cut points in (head, tail])."""
        head, tail = policy.regions(messages)
        cuts = [
            (k, hashes[k])
            for k in range(head + 1, tail + 1)
            if k == len(messages) or messages[k].get("role") != "tool"
        ]
        found: SummaryRecord | None = await run_in_threadpool(self.svc.lookup.longest, tenant, cuts)
        return found


async def _prepare(
    policy: ContextPolicy,
    loaded: Loaded,
    conversation: tuple[str, str],
    tools: list[ToolSpec],
    window: Window,
    best: SummaryRecord | None,
    pressure: float,
) -> Prepared:
    """The stored prepare of a cached snapshot, named for the policy's memory of it; frozen,
    since a `Loaded` and its messages are never changed (api/cache.py)."""
    return await policy.prepare(
        loaded.messages, tools=tools, model=window.model, pressure=pressure,
        book=SummaryBook([best] if best is not None else []), hashes=loaded.hashes,
        conversation=conversation, frozen=True,
    )  # fmt: skip


def _report(prepared: Prepared) -> dict[str, Any]:
    return dict(prepared.report or {})


def _note(rec: RequestLog, report: dict[str, Any], *, degraded: bool) -> None:
    rec.strategies = [str(a.get("strategy")) for a in report.get("applied", [])]
    rec.stale = bool(report.get("stale"))
    rec.degraded = degraded
    if report.get("summary") is not None:
        rec.summary_hit = True
    elif report.get("stale"):
        rec.summary_hit = False
