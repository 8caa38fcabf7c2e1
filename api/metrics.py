"""Prometheus metrics of one app, on a registry of its own (so apps in one process do not clash).

Request-level numbers come from the canonical request log record (the drop-in proxy's fit
outcomes and its providers' answers too); LLM usage and dead letters are read from Redis when
scraped (the counters and lists of every configured tenant), the summary queue's depth and the
age of its oldest job from the broker (Redis or RabbitMQ: `api.brokercheck`). A scrape with Redis
down reports `prefit_store_up 0` and the request metrics, one with the broker down
`prefit_broker_up 0` without the depth; it never fails.

Several API processes on one port (`prefit up --api-workers N`, uvicorn `--workers`) each
count their own requests. With `PROMETHEUS_MULTIPROC_DIR` set (`Settings.metrics_dir`),
prometheus_client keeps each process's counters and histograms in files there and a scrape,
whichever process answers it, sums them (`aggregate`); the Redis numbers are read by that
one process at scrape time, so they are never counted once per process.

Tenant names are not public: a scrape shows LLM usage summed over tenants, and per tenant
(`prefit_tenant_*`, labelled `tenant`) only when it presents `PREFIT_METRICS_TOKEN` as a
bearer token (`render(per_tenant=True)`; the route checks the token).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from api.brokercheck import BrokerCheck
from api.requestlog import RequestLog
from shared.logs import get_logger
from shared.service.replica import with_replica
from shared.store.breaker import BreakerState

log = get_logger(__name__)

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
PREPARE_ROUTES = {
    "/v1/conversations/{conversation_id}/prepare": "stored",
    "/v1/prepare": "stateless",
}
APPEND_ROUTE = "/v1/conversations/{conversation_id}/messages"
# the proxy's errors (api/proxy) that leave no provider status: the provider failed to answer
UPSTREAM_FAILURES = {
    "UpstreamTimeout": "timeout",
    "UpstreamUnreachable": "unreachable",
    "UpstreamBroke": "broke",
}


class Metrics:
    """The app's metrics; `observe` takes every finished request's log record."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefit_http_requests", "HTTP requests", ["route", "status"], registry=r
        )
        self.prepare = Histogram(
            "prefit_prepare_seconds",
            "prepare latency",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.append = Histogram(
            "prefit_append_seconds", "append latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.strategies = Counter(
            "prefit_strategies_applied", "strategies applied by prepare", ["strategy"], registry=r
        )
        self.summaries = Counter(
            "prefit_summary_lookups",
            "prepares that needed a summary: hit (ready) or miss (stale)",
            ["result"],
            registry=r,
        )
        self.stale = Counter(
            "prefit_stale_prepares", "prepares answered while a summary was due", registry=r
        )
        self.degraded = Counter(
            "prefit_degraded_prepares", "prepares answered without Redis", registry=r
        )
        self.enqueued = Counter(
            "prefit_summaries_enqueued", "summary jobs sent", ["kind"], registry=r
        )
        self.scheduled_jobs = Counter(
            "prefit_summaries_scheduled",
            "summary jobs scheduled (sent or refused later)",
            ["kind"],
            registry=r,
        )
        self.enqueue_failures = Counter(
            "prefit_summary_enqueue_failures",
            "summary jobs the broker refused",
            ["kind"],
            registry=r,
        )
        self.errors = Counter(
            "prefit_errors", "error responses by error type", ["type"], registry=r
        )
        self.redis_errors = Counter(
            "prefit_redis_errors",
            "requests that met a Redis error (answered 503, or degraded without Redis)",
            registry=r,
        )
        self.fits = Counter(
            "prefit_proxy_fits",
            "proxy requests by what prepare did (x-prefit-fit: applied, unchanged, skipped)",
            ["outcome"],
            registry=r,
        )
        self.upstream = Counter(
            "prefit_upstream_responses",
            "the proxy's provider answers: status class (2xx, 4xx, 5xx, exactly 429) or failure",
            ["route", "status"],
            registry=r,
        )
        self._store: StoreCollector | None = None
        self._share: ShareCollector | None = None
        self._processes: Path | None = None
        self.replica: str | None = None  # every sample's `replica` label (shared.service.replica)

    def observe(self, record: RequestLog) -> None:
        self.requests.labels(record.route, str(record.status)).inc()
        if record.error is not None:
            self.errors.labels(record.error).inc()
        if record.error == "StoreUnavailable" or record.degraded:
            self.redis_errors.inc()
        if record.fit is not None:
            self.fits.labels(record.fit).inc()
        upstream = upstream_status(record)
        if upstream is not None:
            self.upstream.labels(record.route, upstream).inc()
        if not 200 <= record.status < 300:
            return
        seconds = record.latency_ms / 1000
        kind = PREPARE_ROUTES.get(record.route)
        if kind is not None:
            self.prepare.labels(kind).observe(seconds)
            for name in record.strategies:
                self.strategies.labels(name).inc()
            if record.summary_hit is not None:
                self.summaries.labels("hit" if record.summary_hit else "miss").inc()
            if record.stale:
                self.stale.inc()
            if record.degraded:
                self.degraded.inc()
        elif record.route == APPEND_ROUTE:
            self.append.observe(seconds)

    def scheduled(self, kind: str) -> None:
        """A summary job was scheduled (its send follows, after the answer)."""
        self.scheduled_jobs.labels(kind).inc()

    def sent(self, kind: str, ok: bool) -> None:
        """A summary job was published (or failed to be)."""
        (self.enqueued if ok else self.enqueue_failures).labels(kind).inc()

    def watch_store(self, collector: StoreCollector) -> None:
        self._store = collector

    def watch_share(self, collector: ShareCollector) -> None:
        """Report each tenant's share of the proxy's upstreams (api/proxy/upstream.py)."""
        self._share = collector

    def aggregate(self, directory: Path) -> None:
        """Render the request metrics of every process writing to `directory` (summed), not
        this process's alone. prometheus_client writes there when `PROMETHEUS_MULTIPROC_DIR`
        named it before it was imported (the process's environment)."""
        self._processes = directory

    def render(self, *, per_tenant: bool = False, store: bool = True) -> bytes:
        """The exposition: request metrics, then what Redis says (nothing read from it when
        `store` is False: it is reported down); per-tenant series only if `per_tenant`."""
        if self._processes is None:
            out = bytes(generate_latest(with_replica(self.registry, self.replica)))
        else:
            summed = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(summed, path=str(self._processes))  # type: ignore[no-untyped-call]
            out = bytes(generate_latest(with_replica(summed, self.replica)))
        if self._store is not None:
            scrape = CollectorRegistry(auto_describe=False)
            scrape.register(self._store.view(per_tenant=per_tenant, reachable=store))
            out += bytes(generate_latest(with_replica(scrape, self.replica)))
        if self._share is not None:
            shares = CollectorRegistry(auto_describe=False)
            shares.register(self._share.view(per_tenant))
            out += bytes(generate_latest(with_replica(shares, self.replica)))
        return out


def upstream_status(record: RequestLog) -> str | None:
    """The provider's answer to a proxied request as a label, None if none was asked."""
    failure = UPSTREAM_FAILURES.get(record.error or "")
    if failure is not None:
        return failure
    status = record.upstream_status
    if status is None:
        return None
    return "429" if status == 429 else f"{status // 100}xx"


class StoreCollector:
    """Scrape-time numbers from Redis: LLM usage (summed, and per tenant for
    `view(per_tenant=True)`), dead letters kept and the summarizer breakers; and the broker's
    summary queue depth and oldest job's age."""

    def __init__(
        self,
        *,
        broker: Callable[[], BrokerCheck],
        usage: Callable[[str], Any],
        tenants: Sequence[str],
        per_tenant: bool = False,
        reachable: bool = True,
        breakers: Callable[[], Sequence[BreakerState]] | None = None,
        dead_letters: Callable[[str], int] | None = None,
    ) -> None:
        self._broker = broker
        self._usage = usage
        self._tenants = list(tenants)
        self._per_tenant = per_tenant
        self._reachable = reachable
        self._breakers = breakers
        self._dead_letters = dead_letters

    def view(self, *, per_tenant: bool, reachable: bool = True) -> StoreCollector:
        """This collector for one scrape (with or without tenant names; Redis or not)."""
        return StoreCollector(
            broker=self._broker,
            usage=self._usage,
            tenants=self._tenants,
            per_tenant=per_tenant,
            reachable=reachable,
            breakers=self._breakers,
            dead_letters=self._dead_letters,
        )

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("prefit_store_up", "1 if Redis answered this scrape")
        usage = _Usage(self._per_tenant)
        breaker = GaugeMetricFamily(
            "prefit_summarizer_breaker_open",
            "1 while a summarizer's breaker is open or half-open (no calls but a probe)",
            labels=["provider"],
        )
        dead = GaugeMetricFamily(
            "prefit_dead_letters",
            "summary jobs given up, kept per tenant (dead_letters_max each, for retention_s)",
        )
        ok = 1.0 if self._reachable else 0.0
        try:
            if not self._reachable:
                raise TimeoutError("redis did not answer within the scrape's time")
            kept = 0
            for tenant in self._tenants:
                usage.add(tenant, self._usage(tenant))
                kept += self._dead_letters(tenant) if self._dead_letters is not None else 0
            dead.add_metric([], float(kept))
            for state in self._breakers() if self._breakers is not None else ():
                breaker.add_metric([state.label], 0.0 if state.state == "closed" else 1.0)
        except Exception as exc:  # a scrape must answer even with Redis down
            log.warning("metrics.store_unavailable", error=type(exc).__name__)
            ok = 0.0
        up.add_metric([], ok)
        yield up
        if ok:
            yield from usage.families()
            yield breaker
            yield dead
        if self._reachable:  # past the scrape's time: the broker is not asked either
            yield from self._queue_depth()

    def _queue_depth(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("prefit_broker_up", "1 if the broker answered this scrape")
        try:
            broker = self._broker()
            waiting, age = broker.depth(), broker.oldest_age()
        except Exception as exc:  # the broker (Redis or RabbitMQ) is down: no depth to report
            log.warning("metrics.broker_unavailable", error=type(exc).__name__)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        depth = GaugeMetricFamily(
            "prefit_summary_queue_depth", "summary jobs waiting in the broker"
        )
        depth.add_metric([], float(waiting))
        yield depth
        if age is not None:  # Redis only (RabbitMQ cannot tell without taking the job)
            oldest = GaugeMetricFamily(
                "prefit_summary_queue_oldest_seconds",
                "how long the oldest summary job sent by the API has waited (0: none waiting)",
            )
            oldest.add_metric([], age)
            yield oldest


class ShareCollector:
    """The proxy's upstream requests in flight and refused past a tenant's share, this
    process's (summed, and per tenant for `view(True)`)."""

    def __init__(
        self,
        counts: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]],
        cap: int,
        per_tenant: bool = False,
    ) -> None:
        self._counts = counts
        self._cap = cap
        self._per_tenant = per_tenant

    def view(self, per_tenant: bool) -> ShareCollector:
        """This collector for one scrape (with or without tenant names)."""
        return ShareCollector(self._counts, self._cap, per_tenant)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        held, refused = self._counts()
        cap = GaugeMetricFamily(
            "prefit_upstream_tenant_cap",
            "a tenant's share: its upstream requests at once, per API process (429 past it)",
        )
        cap.add_metric([], float(self._cap))
        yield cap
        yield GaugeMetricFamily(
            "prefit_upstream_in_flight",
            "the proxy's upstream requests in flight, all tenants (this process)",
            value=float(sum(held.values())),
        )
        yield CounterMetricFamily(
            "prefit_upstream_share_refused",
            "upstream requests refused 429 past a tenant's share, all tenants (this process)",
            value=float(sum(refused.values())),
        )
        if not self._per_tenant:
            return
        tenant_held = GaugeMetricFamily(
            "prefit_tenant_upstream_in_flight",
            "the tenant's upstream requests in flight (this process)",
            labels=["tenant"],
        )
        tenant_refused = CounterMetricFamily(
            "prefit_tenant_upstream_share_refused",
            "the tenant's upstream requests refused past its share (this process)",
            labels=["tenant"],
        )
        for tenant in sorted(set(held) | set(refused)):
            tenant_held.add_metric([tenant], float(held.get(tenant, 0)))
            tenant_refused.add_metric([tenant], float(refused.get(tenant, 0)))
        yield tenant_held
        yield tenant_refused


class _Usage:
    """LLM usage series: sums over tenants, and per tenant when allowed."""

    def __init__(self, per_tenant: bool) -> None:
        self.per_tenant = per_tenant
        self.sums = [0.0, 0.0, 0.0, 0.0]  # input, output, cost, summaries
        self.tokens = CounterMetricFamily(
            "prefit_tenant_llm_tokens", "summarizer tokens", labels=["tenant", "direction"]
        )
        self.cost = CounterMetricFamily(
            "prefit_tenant_llm_cost_usd", "summarizer cost in USD", labels=["tenant"]
        )
        self.made = CounterMetricFamily(
            "prefit_tenant_summaries_made", "summary records written", labels=["tenant"]
        )

    def add(self, tenant: str, u: Any) -> None:
        figures = (float(u.input_tokens), float(u.output_tokens), float(u.cost), u.summaries)
        self.sums = [a + float(b) for a, b in zip(self.sums, figures, strict=True)]
        if self.per_tenant:
            self.tokens.add_metric([tenant, "input"], figures[0])
            self.tokens.add_metric([tenant, "output"], figures[1])
            self.cost.add_metric([tenant], figures[2])
            self.made.add_metric([tenant], float(figures[3]))

    def families(self) -> Iterator[Metric]:
        tokens = CounterMetricFamily(
            "prefit_llm_tokens", "summarizer tokens, all tenants", labels=["direction"]
        )
        tokens.add_metric(["input"], self.sums[0])
        tokens.add_metric(["output"], self.sums[1])
        yield tokens
        yield CounterMetricFamily(
            "prefit_llm_cost_usd", "summarizer cost in USD, all tenants", value=self.sums[2]
        )
        yield CounterMetricFamily(
            "prefit_summaries_made", "summary records written, all tenants", value=self.sums[3]
        )
        if self.per_tenant:
            yield from (self.tokens, self.cost, self.made)
