"""Asking the workers for a summary: by task name, deduplicated, never blocking a request long.

The API never imports the worker package: it sends `prefit.summarize` by name on a bare
Celery app pointed at the broker. A `SummaryTrigger` enqueues at most once per conversation
state. The state (the dedupe marker) is the kind of request (ahead of time, or stale at
prepare), the summary record the conversation is served from now, and its size in steps of
5% of the budget: a worker may find a job not due yet, and the conversation is asked for
again once it has grown a step (or the marker expired). A conversation whose summary from its
current record was dead-lettered lately is not asked for until that block expires (the same
round trip; `shared.store.blocks`). The marker is claimed in the request
and the job published after the response (a Celery publish costs milliseconds); the request
succeeds whatever the broker does. A send the broker refuses clears its marker and keeps the
job in Redis (`shared.store.unsent`): the workers' reapers send it once the broker is back,
so the conversation needs no new turn; `summary.enqueue_failed` is logged once per
conversation until then (`summary.enqueue_kept` at debug level for later refusals).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from api.brokercheck import ENQUEUED_MS
from shared.errors import StoreUnavailable
from shared.logs import get_logger
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
class Reservation:
    """The right to send one job: its dedupe marker is set, the send is still to come."""

    job: SummaryJob
    kind: Kind
    marker: str


class SummaryTrigger:
    """Enqueue summary jobs once per (conversation, kind, current record).

    `claim` (in the request) sets the dedupe marker; `send` (after the response, in the
    background, or inline when the caller waits for the summary) publishes the job. A send
    that fails clears the marker so the next trigger claims again; it never raises.
    """

    def __init__(
        self,
        store: Store,
        enqueue: Enqueue,
        *,
        on_sent: Callable[[Kind, bool], None] | None = None,
        on_claimed: Callable[[Kind], None] | None = None,
        queue: str = "summaries",
    ) -> None:
        self._store = store
        self._enqueue = enqueue
        self._queue = queue  # where a refused job is kept for the reapers
        self._on_sent = on_sent
        self._on_claimed = on_claimed

    def claim(
        self, job: SummaryJob, kind: Kind, best: SummaryRecord | None, *, step: int
    ) -> Reservation | None:
        """A `Reservation` unless a job for this state was claimed already (`StoreUnavailable`
        passes).

        `step` is the conversation's size in coarse steps (see `size_step`): growth by a step
        is a new state, so a job the worker found not due yet is asked again as it grows.
        """
        marker = marker_for(kind, best, step)
        ttl = MARKER_TTL_S[kind]
        tenant, conv_id = job.tenant, job.conversation_id
        claimed = self._store.blocks.claim_enqueue(tenant, conv_id, marker, origin(best), ttl)
        if claimed < 0:  # its summary failed lately (shared.store.blocks): not before the backoff
            log.debug("summary.enqueue_blocked", tenant=tenant, conversation_id=conv_id, kind=kind)
            return None
        if not claimed:
            return None
        if self._on_claimed is not None:
            self._on_claimed(kind)
        return Reservation(job, kind, marker)

    def send(self, claim: Reservation) -> bool:
        """Publish the claimed job; True if the broker took it."""
        job = claim.job
        ids = {"tenant": job.tenant, "conversation_id": job.conversation_id, "kind": claim.kind}
        try:
            self._enqueue(job, PRIORITY[claim.kind])
        except Exception as exc:  # broker down (StoreUnavailable) or a faulty enqueue hook
            first = self._keep(claim)
            event = "summary.enqueue_failed" if first else "summary.enqueue_kept"
            (log.warning if first else log.debug)(event, **ids, error=type(exc).__name__)
            with contextlib.suppress(StoreUnavailable):  # else the marker expires on its own
                self._store.leases.clear_enqueue(job.tenant, job.conversation_id, claim.marker)
            self._sent(claim.kind, False)
            return False
        log.debug("summary.enqueued", **ids, length=job.length, priority=PRIORITY[claim.kind])
        self._sent(claim.kind, True)
        return True

    def _keep(self, claim: Reservation) -> bool:
        """Keep the refused job for the reapers; True if it is the conversation's first (or it
        could not be kept: Redis is failing too, and that is worth a line each time)."""
        try:
            return self._store.unsent.keep(self._queue, claim.job.to_kwargs(), PRIORITY[claim.kind])
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
