"""What every request handler needs, built once per app: settings, store, counters, caches.

Nothing here connects to Redis: clients connect on their first command, so building the app
(and importing `api.app`) is safe without Redis.

Redis clients are sized to the request deadline (`PREFIT_REQUEST_DEADLINE_S`, see
api/deadline.py): a command waits at most the deadline for its reply and half of it to
connect, a dropped connection is retried once after at most 0.1 s, a timeout never (the
command may have run), no health-check command is added on the asyncio client, and a full
connection pool fails at once instead of waiting (redis-py's pools do not wait).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster

from api.auth import KeyRing
from api.brokercheck import BrokerCheck, broker_check
from api.cache import ConversationCache
from api.metrics import Metrics, StoreCollector
from api.policies import Policies
from api.ratios import CachedRatios
from api.requestlog import request_log
from api.schedule import CeleryEnqueue, Enqueue, Scheduler
from shared.counting.calibration import ScaledCounter
from shared.counting.counters import HeuristicCounter, TokenCounter
from shared.service.replica import replica_name
from shared.settings import Settings
from shared.store import Store, keys
from shared.store.client import Client
from shared.store.increments import AsyncIncrements, Increments
from shared.store.lookup import RecordLookup
from shared.store.openings import Openings
from shared.store.tally import Tally
from shared.validation import ValidatedPrefixes


def async_client_like(client: Client) -> redis.asyncio.Redis | AsyncRedisCluster:
    """An asyncio client on the same server (or cluster), database, credentials and timeouts
    as `client`, retrying like it: once, quickly, on a dropped connection; never on a timeout
    (a cluster client retries its read once either way: it only reads)."""
    if isinstance(client, RedisCluster):
        return _async_cluster_like(client)
    kw = client.connection_pool.connection_kwargs
    common: dict[str, Any] = {
        "db": kw.get("db", 0),
        "username": kw.get("username"),
        "password": kw.get("password"),
        "socket_timeout": kw.get("socket_timeout"),
        "socket_connect_timeout": kw.get("socket_connect_timeout"),
        "retry": AsyncRetry(ExponentialBackoff(cap=0.1, base=0.01), 1, (redis.ConnectionError,)),
        "health_check_interval": 0,
    }
    if "path" in kw:
        return redis.asyncio.Redis(unix_socket_path=kw["path"], **common)
    ssl = client.connection_pool.connection_class is redis.SSLConnection
    return redis.asyncio.Redis(
        host=kw.get("host", "localhost"), port=kw.get("port", 6379), ssl=ssl, **common
    )


def _async_cluster_like(client: RedisCluster) -> AsyncRedisCluster:
    """The asyncio `RedisCluster` beside `client`, started from the primaries it knows (it
    reads the topology on its first command, on this event loop)."""
    kw = client.get_connection_kwargs()  # type: ignore[no-untyped-call]
    primaries = client.get_primaries()  # type: ignore[no-untyped-call]
    return AsyncRedisCluster(
        startup_nodes=[AsyncClusterNode(n.host, n.port) for n in primaries],
        username=kw.get("username"),
        password=kw.get("password"),
        socket_timeout=kw.get("socket_timeout"),
        socket_connect_timeout=kw.get("socket_connect_timeout"),
        ssl=kw.get("connection_class") is redis.SSLConnection,
        retry=AsyncRetry(ExponentialBackoff(cap=0.1, base=0.01), 1),
    )


def counter_id(base: TokenCounter) -> str:
    """A short id of a counter's configuration: a tally made by another one is recounted."""
    return hashlib.blake2b(repr(base).encode(), digest_size=6).hexdigest()


@dataclass
class Services:
    """The app's long-lived parts (one per app; shared by every request)."""

    settings: Settings
    keyring: KeyRing
    store: Store
    enqueue: Enqueue
    metrics: Metrics = field(default_factory=Metrics)
    base: HeuristicCounter = field(default_factory=HeuristicCounter)
    _broker: BrokerCheck | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _aclients: dict[asyncio.AbstractEventLoop, AsyncIncrements] = field(default_factory=dict)

    def __post_init__(self) -> None:
        client = self.store.client
        retention = self.settings.retention_s
        self.tally = Tally(client, retention_s=retention)
        self.lookup = RecordLookup(client)
        self.cache = ConversationCache(Increments(client))
        self.ratios = CachedRatios(self.store.ratios)
        if self.settings.metrics_dir is not None:
            self.metrics.aggregate(self.settings.metrics_dir)
        self.metrics.replica = replica_name(self.settings)
        self.policies = Policies(self.settings)
        self.counter_id = counter_id(self.base)
        self.openings = Openings()  # the tenants' memory of repeated openings (prepare, proxy)
        # transcripts resent every turn (the proxy's) are validated in O(new)
        self.validated: ValidatedPrefixes[None] = ValidatedPrefixes()
        self.scheduler = Scheduler(
            self.store,
            self.enqueue,
            counter=self.base,
            on_sent=self.metrics.sent,
            on_scheduled=self.metrics.scheduled,
            queue=self.settings.summary_queue,
        )
        self.metrics.watch_store(
            StoreCollector(
                broker=self.broker,
                usage=self.store.usage.get,
                tenants=self.keyring.tenants,
                breakers=self.store.breakers.all,
                dead_letters=lambda tenant: int(client.llen(keys.dead_letters(tenant))),
            )
        )

    @classmethod
    def build(
        cls, settings: Settings, *, store: Store | None = None, enqueue: Enqueue | None = None
    ) -> Services:
        keyring = KeyRing.parse(settings.api_keys)
        if store is None:
            limit = settings.request_deadline_s
            store = Store.from_url(
                settings.redis_url,
                settings,
                socket_timeout=min(settings.redis_socket_timeout_s, limit),
                connect_timeout=min(settings.redis_connect_timeout_s, limit / 2),
            )
        return cls(
            settings=settings,
            keyring=keyring,
            store=store,
            enqueue=enqueue if enqueue is not None else CeleryEnqueue(settings),
        )

    def scaled(self, tenant: str, model: str | None) -> ScaledCounter:
        """The tenant's counter for `model`: its ratio read once (1.0 before any observation;
        `StoreUnavailable` propagates: nothing counts with a guess)."""
        return self.scaled_by(self.ratios.get(tenant, model))

    def scaled_by(self, ratio: float | None) -> ScaledCounter:
        """The base counter scaled by `ratio` (1.0 for None), kept within the rule's bounds."""
        if ratio is None:
            return ScaledCounter(self.base, 1.0)
        low, high = self.store.ratios.rule.bounds
        return ScaledCounter(self.base, min(max(ratio, low), high))

    def increments(self) -> AsyncIncrements:
        """Async incremental reads on this event loop's own Redis client (made on first use).

        A `redis.asyncio` client belongs to one loop; the server has one, but tests start a
        loop per client, so clients are kept per loop and those of closed loops dropped.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [lp for lp in self._aclients if lp.is_closed()]:
                del self._aclients[old]
            found = self._aclients.get(loop)
            if found is None:
                found = AsyncIncrements(async_client_like(self.store.client))
                self._aclients[loop] = found
            return found

    async def aclose(self) -> None:
        """Close this loop's async clients (the sync ones are closed by `close`)."""
        with self._lock:
            found = self._aclients.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found.aclose()

    def broker(self) -> BrokerCheck:
        """The broker's check (readiness and queue depth; Redis or RabbitMQ), made on first use."""
        with self._lock:
            if self._broker is None:  # readiness and scrapes: a quarter of the deadline
                quarter = self.settings.request_deadline_s / 4
                self._broker = broker_check(self.settings, quarter)
            return self._broker

    def close(self, *, close_store: bool = True) -> None:
        closer = getattr(self.enqueue, "close", None)
        if callable(closer):
            closer()
        if self._broker is not None:
            self._broker.close()
            self._broker = None
        if close_store:
            self.store.close()


_bearer = HTTPBearer(auto_error=False, description="Bearer <API key> (PREFIT_API_KEYS)")


async def get_services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def get_tenant(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
) -> str:
    """The request's tenant, from its bearer key only."""
    svc: Services = request.app.state.services
    header = (
        f"Bearer {credentials.credentials}"
        if credentials is not None
        else request.headers.get("authorization")
    )
    tenant = svc.keyring.tenant_for(header)
    request_log(request).tenant = tenant
    return tenant
