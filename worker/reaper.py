"""Every worker's reaper: sends again the jobs whose worker stopped renewing them.

A running job's in-flight entry (`shared.store.inflight`) is pushed back with its lease every
ttl/3; a worker killed mid-summary stops pushing. Every `reaper_interval_s` this thread takes
the queue's entries whose deadline has passed (atomically: each goes to one reaper) and
enqueues their task again by name, with the same task id (a delivery of the same task, so a
lease its dead predecessor still held makes it wait, not end), its retries counted, and the
priority of a job someone may be waiting for. A job lost that way runs again about
`lease_ttl_s + reaper_interval_s` after its worker died (6 s with the defaults), whatever the
broker's visibility timeout (an hour) and on either broker (RabbitMQ gives a lost worker's
tasks back at once when its connection drops; the reaper still covers a worker that hangs
without dropping it). If the broker refuses the send, the entry goes back, due at the next
sweep.

The jobs the API could not publish (`shared.store.unsent`) are sent the same way; while the
broker refuses them, the reaper runs up to `LOCAL_MAX` of them itself, on the worker's own
event loop, so summaries keep coming during a broker outage instead of resuming only once
the broker is back (RabbitMQ takes 5-15 s to start again). A job so run is taken out of the
unsent index first; its lease and in-flight entry are the same as a delivered task's, so a
copy the broker delivers later finds the summary written (or the lease held) and does
nothing. One that fails is kept again, for the broker and Celery's retries once it is back,
and is not run here again.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from shared.errors import ConfigError, StoreUnavailable
from shared.logs import get_logger
from shared.service.broker import priority
from shared.service.jobs import PRIORITY_STALE, TASK_NAME, SummaryJob
from shared.store import Store, Ticket, UnsentJob

BATCH = 100
LOCAL_MAX = 8  # unsent jobs one worker runs itself at once while the broker refuses them
TRIED_MAX = 10_000  # jobs remembered as run here, so a failing one is not run here again

# Starts a job on the worker's event loop without waiting for it (`Runtime.submit`).
Runner = Callable[[SummaryJob, Ticket], "Future[Any]"]

log = get_logger(__name__)


class Reaper:
    """One daemon thread per worker process, sweeping its queue's in-flight registry."""

    def __init__(
        self,
        app: Any,
        store: Store,
        queue: str,
        interval_s: float,
        runner: Runner | None = None,
    ) -> None:
        self._app, self._store, self._queue = app, store, queue
        self.interval_s = interval_s
        self._runner = runner  # None: unsent jobs wait for the broker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._local = 0  # unsent jobs running here now
        self._tried: set[str] = set()  # the stored JSON of every unsent job run here

    def start(self) -> None:
        """Start sweeping (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10)

    def sweep(self) -> int:
        """Send again every job of the queue whose deadline has passed, then the jobs the API
        could not send; how many were sent."""
        sent = 0
        while True:
            tickets = self._store.inflight.reap(self._queue, BATCH)
            sent += sum(1 for t in tickets if self._send(t))
            if len(tickets) < BATCH:
                return sent + self.send_unsent()

    def send_unsent(self) -> int:
        """Send the jobs the broker refused to the API (oldest first, until the broker refuses
        again); how many were sent."""
        sent = 0
        due = self._store.unsent.due(self._queue, BATCH)
        for i, job in enumerate(due):
            try:
                self._app.send_task(
                    TASK_NAME,
                    kwargs=dict(job.kwargs),
                    queue=self._queue,
                    priority=priority(job.priority, self._app.conf.broker_url),
                )
            except Exception as exc:  # still down: run some here, the rest waits
                log.info("summary.unsent_failed", queue=self._queue, error=type(exc).__name__)
                self.run_here(due[i:])
                break
            self._store.unsent.sent(self._queue, job)
            log.info(
                "summary.unsent_sent",
                tenant=job.tenant,
                conversation_id=job.conversation_id,
                priority=job.priority,
            )
            sent += 1
        return sent

    def run_here(self, jobs: list[UnsentJob]) -> int:
        """Start unsent jobs on this worker (at most `LOCAL_MAX` at once, each at most once
        here), taking them out of the unsent index; how many were started."""
        started = 0
        for job in jobs:
            with self._lock:
                if self._runner is None or self._local >= LOCAL_MAX:
                    return started
                if job.raw in self._tried:
                    continue
                if len(self._tried) >= TRIED_MAX:
                    self._tried.clear()
                self._tried.add(job.raw)
                self._local += 1
            self._store.unsent.sent(self._queue, job)  # taken: its copy here is the one
            try:
                summary = SummaryJob.from_kwargs(dict(job.kwargs))
            except ConfigError:
                self._ran(job, None)
                continue
            ticket = Ticket(f"unsent-{uuid.uuid4().hex}", self._queue, dict(job.kwargs), 0)
            future = self._runner(summary, ticket)
            future.add_done_callback(functools.partial(self._ran, job))
            log.info(
                "summary.run_without_broker",
                tenant=job.tenant,
                conversation_id=job.conversation_id,
                task_id=ticket.task_id,
            )
            started += 1
        return started

    def _ran(self, job: UnsentJob, future: Future[Any] | None) -> None:
        with self._lock:
            self._local -= 1
        if future is None or future.exception() is None:
            return
        error = type(future.exception()).__name__
        log.warning(
            "summary.run_without_broker_failed",
            tenant=job.tenant,
            conversation_id=job.conversation_id,
            error=error,
        )
        try:  # for the broker, and Celery's retries, once it is back
            self._store.unsent.keep(self._queue, job.kwargs, job.priority)
        except StoreUnavailable:
            log.warning("summary.unsent_unavailable", conversation_id=job.conversation_id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except StoreUnavailable:
                log.warning("summary.reaper_unavailable", queue=self._queue)
            except Exception as exc:  # the sweep must go on; a bug here must not kill it
                log.error("summary.reaper_crashed", queue=self._queue, error=type(exc).__name__)

    def _send(self, ticket: Ticket) -> bool:
        ids = {"task_id": ticket.task_id, "conversation_id": ticket.kwargs.get("conversation_id")}
        try:
            self._app.send_task(
                TASK_NAME,
                kwargs=dict(ticket.kwargs),
                task_id=ticket.task_id,
                queue=ticket.queue,
                priority=priority(PRIORITY_STALE, self._app.conf.broker_url),
                retries=ticket.retries + 1,
            )
        except Exception as exc:  # the broker is not there: back in the registry, due next sweep
            log.warning("summary.reap_failed", **ids, error=type(exc).__name__)
            self._store.inflight.register(ticket, self.interval_s)
            return False
        log.warning("summary.task_reaped", **ids, tenant=ticket.kwargs.get("tenant"))
        return True
