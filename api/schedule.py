"""When the API asks the workers for a summary, and the asking: the one home of both.

The decision is in two places of one request's life, both here (`Scheduler`):
- *ahead*, after a write (an append, a PUT, the proxy's sync): once the conversation's
  effective tokens (head + best record + the rest) reach `(trigger - precompute_at) x budget`,
  state `nearing` or `over` (`ContextPolicy.state`), a job is scheduled at normal priority, so
  the record is ready before a prepare needs it;
- *stale*, at a prepare: when the policy served the prompt while a better record was due and
  not ready (`ContextPolicy.summary_due`, the report's `stale`), at high priority.
What range the job summarizes, and whether it is still due when a worker runs it, is the
policy's `plan_summary` (shared/service/precompute.py): a job scheduled early finds nothing
to do and ends.

A conversation state is scheduled once: the state (the marker, `shared.store.pending`) is
the kind, the record the conversation is served from now, and its size in steps of 5% of the
budget, so a job the worker found not due yet is asked for again once the conversation has
grown a step (or the marker expired). A conversation whose summary from its current record
was dead-lettered lately is not asked for until that block expires (the same round trip;
`shared.store.blocks`). The marker is set in the request and the `PendingJob` sent after the
response (a Celery publish costs milliseconds), or at once when the caller waits for the
record; the request succeeds whatever the broker does.

The API never imports the worker package: it sends `prefit.summarize` by name on a bare
Celery app pointed at the broker. A send the broker refuses clears its marker and keeps the
job in Redis (`shared.store.unsent`): the workers' reapers send it once the broker is back,
so the conversation needs no new turn; `summary.enqueue_failed` is logged once per
conversation until then (`summary.enqueue_kept` at debug level for later refusals).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api.brokercheck import ENQUEUED_MS
from api.policies import Window
from shared.counting.counters import HeuristicCounter
from shared.counting.protocol import MessageCounter
from shared.errors import StoreUnavailable
from shared.logs import get_logger
from shared.messages import ToolSpec
from shared.policy import State
from shared.service.broker import celery_options
from shared.service.broker import priority as priority_for
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE, TASK_NAME, SummaryJob
from shared.settings import Settings
from shared.store import Store
from shared.store.blocks import origin
from shared.summaries.book import SummaryRecord

log = get_logger(__name__)

Enqueue = Callable[[SummaryJob, int], None]
Kind = Literal["ahead", "stale"]

MARKER_TTL_S: dict[Kind, float] = {"ahead": 120.0, "stale": 15.0}
STEP_OF_BUDGET = 0.05  # growth by 5% of the budget is a new state (2 steps in the precompute band)
PRIORITY: dict[Kind, int] = {"ahead": PRIORITY_AHEAD, "stale": PRIORITY_STALE}


RETRY_ONCE = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}


class CeleryEnqueue:
    """`send_task` on a bare Celery app; broker faults become `StoreUnavailable` quickly."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._app: Any = None
        self._lock = threading.Lock()

    def _celery(self) -> Any:
        with self._lock:
            if self._app is None:
                from celery import Celery

                app = Celery("prefit-api", broker=self._settings.broker, set_as_current=False)
                # the queue declared, and priorities stored, as the workers do
                shared = celery_options(self._settings, "api")
                app.conf.update(
                    shared,
                    broker_connection_timeout=1.0,
                    broker_connection_retry=False,
                    broker_transport_options={
                        **shared["broker_transport_options"],
                        # max_retries bounds reconnects when publishing
                        "max_retries": 1,
                        "interval_start": 0,
                        "interval_step": 0.2,
                        "interval_max": 0.2,
                        "socket_timeout": 2.0,  # Redis
                        "socket_connect_timeout": 1.0,
                        "read_timeout": 2.0,  # RabbitMQ (py-amqp), confirms included
                        "write_timeout": 2.0,
                    },
                    task_serializer="json",
                )
                self._app = app
            return self._app

    def warm(self) -> None:
        """Build the Celery app now (imports take ~1 s): start-up calls it in the background."""
        app = self._celery()
        _ = app.amqp.producer_pool  # loads kombu's producer machinery; connects to nothing

    def __call__(self, job: SummaryJob, priority: int) -> None:
        """Publish `job`; `priority` is a rank (`shared.service.jobs`), 0 served first on any
        broker."""
        try:
            self._celery().send_task(
                TASK_NAME,
                kwargs=job.to_kwargs(),
                queue=self._settings.summary_queue,
                priority=priority_for(priority, self._settings.broker),
                # once, at once: a connection the broker dropped (a restart) is made again
                retry=True,
                retry_policy=RETRY_ONCE,
                headers={ENQUEUED_MS: int(time.time() * 1000)},  # the queue's age on /metrics
            )
        except Exception as exc:  # kombu/redis/socket errors: the broker is not there
            raise StoreUnavailable(f"broker unavailable: {type(exc).__name__}") from exc

    def close(self) -> None:
        with self._lock:
            if self._app is not None:
                self._app.close()
                self._app = None


@dataclass(frozen=True)
class JobScope:
    """The conversation a job would summarize: whose, measured in which window, up to where."""

    tenant: str
    conv_id: str
    window: Window
    length: int
    last_hash: str
    tools: Sequence[ToolSpec] = ()


@dataclass(frozen=True)
class PendingJob:
    """A scheduled summary job: its marker is set, its send is still to come."""

    job: SummaryJob
    kind: Kind
    marker: str


class Scheduler:
    """Schedules summary jobs once per (conversation, kind, current record, size step).

    `ahead` (after a write) and `stale` (at a prepare) decide and set the marker in the
    request; `send` (after the response, in the background, or inline when the caller waits
    for the summary) publishes the job. A send that fails clears the marker so the next
    trigger schedules again; it never raises.
    """

    def __init__(
        self,
        store: Store,
        enqueue: Enqueue,
        *,
        counter: MessageCounter | None = None,
        on_sent: Callable[[Kind, bool], None] | None = None,
        on_scheduled: Callable[[Kind], None] | None = None,
        queue: str = "summaries",
    ) -> None:
        self._store = store
        self._enqueue = enqueue
        self._counter = counter or HeuristicCounter()  # the tool specs' tokens, for the job
        self._queue = queue  # where a refused job is kept for the reapers
        self._on_sent = on_sent
        self._on_scheduled = on_scheduled

    def ahead(
        self, scope: JobScope, state: State, effective: int, budget: int, best: SummaryRecord | None
    ) -> PendingJob | None:
        """After a write that leaves `scope` nearing or over the trigger (`state`, at
        `effective` tokens of `budget`): its job, at normal priority, once per state."""
        if state == "under":
            return None
        return self._guarded(scope, "ahead", best, size_step(effective, budget))

    def stale(
        self, scope: JobScope, report: Mapping[str, Any], best: SummaryRecord | None
    ) -> PendingJob | None:
        """At a prepare whose `report` says a summary was due and not ready: its job, at high
        priority, once per state."""
        if not report.get("stale"):
            return None
        return self._guarded(
            scope, "stale", best, size_step(report["tokens_before"], report["budget"])
        )

    def schedule(
        self, job: SummaryJob, kind: Kind, best: SummaryRecord | None, *, step: int
    ) -> PendingJob | None:
        """A `PendingJob` unless this state was scheduled already or its range is blocked
        (`StoreUnavailable` passes).

        `step` is the conversation's size in coarse steps (see `size_step`): growth by a step
        is a new state, so a job the worker found not due yet is asked again as it grows.
        """
        marker = marker_for(kind, best, step)
        tenant, conv_id = job.tenant, job.conversation_id
        marked = self._store.pending.mark(tenant, conv_id, marker, origin(best), MARKER_TTL_S[kind])
        if marked < 0:  # its summary failed lately (shared.store.blocks): not before the backoff
            log.debug("summary.schedule_blocked", tenant=tenant, conversation_id=conv_id, kind=kind)
            return None
        if not marked:
            return None
        if self._on_scheduled is not None:
            self._on_scheduled(kind)
        return PendingJob(job, kind, marker)

    def send(self, pending: PendingJob) -> bool:
        """Publish the scheduled job; True if the broker took it."""
        job = pending.job
        ids = {"tenant": job.tenant, "conversation_id": job.conversation_id, "kind": pending.kind}
        try:
            self._enqueue(job, PRIORITY[pending.kind])
        except Exception as exc:  # broker down (StoreUnavailable) or a faulty enqueue hook
            first = self._keep(pending)
            event = "summary.enqueue_failed" if first else "summary.enqueue_kept"
            (log.warning if first else log.debug)(event, **ids, error=type(exc).__name__)
            with contextlib.suppress(StoreUnavailable):  # else the marker expires on its own
                self._store.pending.clear(job.tenant, job.conversation_id, pending.marker)
            self._sent(pending.kind, False)
            return False
        log.debug("summary.enqueued", **ids, length=job.length, priority=PRIORITY[pending.kind])
        self._sent(pending.kind, True)
        return True

    def send_all(self, pending: Sequence[PendingJob]) -> None:
        """Publish each scheduled job (after the answer)."""
        for one in pending:
            self.send(one)

    def _guarded(
        self, scope: JobScope, kind: Kind, best: SummaryRecord | None, step: int
    ) -> PendingJob | None:
        """`schedule` for `scope`; without Redis nothing (the answer stands, the next trigger
        schedules again)."""
        extra = self._counter.count_tools(scope.tools, scope.window.model)
        job = scope.window.job(scope.tenant, scope.conv_id, scope.length, scope.last_hash, extra)
        try:
            return self.schedule(job, kind, best, step=step)
        except StoreUnavailable as exc:
            ids = {"tenant": scope.tenant, "conversation_id": scope.conv_id, "kind": kind}
            log.warning("summary.schedule_failed", **ids, error=type(exc).__name__)
            return None

    def _keep(self, pending: PendingJob) -> bool:
        """Keep the refused job for the reapers; True if it is the conversation's first (or it
        could not be kept: Redis is failing too, and that is worth a line each time)."""
        try:
            return self._store.unsent.keep(
                self._queue, pending.job.to_kwargs(), PRIORITY[pending.kind]
            )
        except StoreUnavailable:
            return True

    def _sent(self, kind: Kind, ok: bool) -> None:
        if self._on_sent is not None:
            self._on_sent(kind, ok)


def marker_for(kind: Kind, best: SummaryRecord | None, step: int) -> str:
    """The dedupe marker: kind, the hex of the record in use ("none" before any), size step."""
    return f"{kind}-{origin(best)}-{step}"


def size_step(tokens: int, budget: int) -> int:
    """`tokens` in steps of STEP_OF_BUDGET x budget: the size part of a conversation's state."""
    return int(tokens // max(1.0, STEP_OF_BUDGET * budget))
