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
"""

from __future__ import annotations

import threading
from typing import Any

from shared.errors import StoreUnavailable
from shared.logs import get_logger
from shared.service.broker import priority
from shared.service.jobs import PRIORITY_STALE, TASK_NAME
from shared.store import Store, Ticket

BATCH = 100

log = get_logger(__name__)


class Reaper:
    """One daemon thread per worker process, sweeping its queue's in-flight registry."""

    def __init__(self, app: Any, store: Store, queue: str, interval_s: float) -> None:
        self._app, self._store, self._queue = app, store, queue
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

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
        for job in self._store.unsent.due(self._queue, BATCH):
            try:
                self._app.send_task(
                    TASK_NAME,
                    kwargs=dict(job.kwargs),
                    queue=self._queue,
                    priority=priority(job.priority, self._app.conf.broker_url),
                )
            except Exception as exc:  # still down: the rest waits for the next sweep
                log.info("summary.unsent_failed", queue=self._queue, error=type(exc).__name__)
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
