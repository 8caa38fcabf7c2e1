"""A worker process's Prometheus metrics, on its own port (PREFIT_WORKER_METRICS_PORT).

What each delivery did: taken, finished by outcome (`written`, `exists`, `not_due`, `busy`,
`dead_letter`, ...), retried by reason, its duration; the summaries it wrote and the LLM tokens
they cost; how many run now. The queue's depth is the broker's, the same for every worker: the
API's scrape reports it (`prefit_summary_queue_depth`), so no worker repeats it.

One worker process is one Celery node running its tasks on threads (`-P threads`, always, see
`worker_argv`): its counters are in one registry, safe across threads, and each container
serves its own, as Prometheus scrapes each replica (deploy/prometheus/prometheus.yml). Two
worker processes on one host (`prefit up --workers N`) cannot share the port: the first serves
it, the others log `worker.metrics_unavailable` and count for no one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from shared.logs import get_logger
from shared.service.replica import with_replica

log = get_logger(__name__)

TASK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class WorkerMetrics:
    """The counters of one worker process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.taken = Counter("prefit_worker_tasks_taken", "summary deliveries taken", registry=r)
        self.finished = Counter(
            "prefit_worker_tasks_finished",
            "summary deliveries finished, by outcome (written, exists, not_due, busy, "
            "stale_job, blocked, breaker_open, dead_letter, crashed)",
            ["outcome"],
            registry=r,
        )
        self.retried = Counter(
            "prefit_worker_tasks_retried",
            "summary deliveries sent back for a later attempt, by reason",
            ["reason"],
            registry=r,
        )
        self.failed = Counter(
            "prefit_worker_tasks_failed", "summary jobs given up (dead-lettered)", registry=r
        )
        self.written = Counter(
            "prefit_worker_summaries_written", "summary records this worker wrote", registry=r
        )
        self.tokens = Counter(
            "prefit_worker_llm_tokens",
            "summarizer tokens of the summaries this worker wrote",
            ["direction"],
            registry=r,
        )
        self.seconds = Histogram(
            "prefit_worker_task_seconds",
            "time of one delivery, by outcome",
            ["outcome"],
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.active = Gauge("prefit_worker_tasks_active", "deliveries running now", registry=r)

    @contextmanager
    def delivery(self) -> Iterator[None]:
        """Count a delivery taken and running (its end: `ended` or `left`)."""
        self.taken.inc()
        self.active.inc()
        try:
            yield
        finally:
            self.active.dec()

    def ended(self, result: dict[str, Any], seconds: float) -> None:
        """A delivery's result (`JobOutcome.to_dict()`, or a dead letter's dict)."""
        outcome = str(result.get("status", "unknown"))
        self.finished.labels(outcome).inc()
        self.seconds.labels(outcome).observe(seconds)
        if outcome == "dead_letter":
            self.failed.inc()
        records = int(result.get("records") or 0)
        if records:
            self.written.inc(records)
            self.tokens.labels("input").inc(int(result.get("input_tokens") or 0))
            self.tokens.labels("output").inc(int(result.get("output_tokens") or 0))

    def retrying(self, reason: str) -> None:
        """A delivery is sent back for a later attempt (its time: `left`)."""
        self.retried.labels(reason).inc()

    def left(self, outcome: str, seconds: float) -> None:
        """A delivery that ended without a result: `retried`, or `crashed` (it raised)."""
        if outcome != "retried":
            self.finished.labels(outcome).inc()
        self.seconds.labels(outcome).observe(seconds)

    def serve(self, port: int, replica: str | None) -> bool:
        """Serve `/metrics` on `port` (every interface: Prometheus reaches it over the
        containers' network), each sample labelled with `replica`; False if the port is taken."""
        try:
            start_http_server(port, registry=with_replica(self.registry, replica))
        except OSError as exc:
            log.warning("worker.metrics_unavailable", port=port, error=str(exc))
            return False
        log.info("worker.metrics_served", port=port, replica=replica)
        return True
