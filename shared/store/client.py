"""The Redis client the store runs on, and the one place Redis faults become `StoreUnavailable`.

A standalone Redis gets a `redis.Redis`; a Redis Cluster (`PREFIT_REDIS_CLUSTER=true`) gets
redis-py's `RedisCluster`, which reads the cluster's topology from the node `REDIS_URL` names
when it is made and sends each command to the node serving its keys. Every script and MULTI
of the store touches one slot (shared/store/keys.py), so both clients run the same code, with one
difference in pipelines: a cluster pipeline has no `eval` method, so scripts go into
pipelines through `eval_in`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeAlias, TypeVar
from urllib.parse import urlsplit

import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from shared.errors import ConfigError, StoreUnavailable
from shared.logs import get_logger

log = get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0

# What the store runs on: a standalone Redis or a Redis Cluster (the same commands on both).
Client: TypeAlias = redis.Redis | RedisCluster


def connect(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout: float = SOCKET_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    max_connections: int | None = None,
) -> Client:
    """A client with explicit timeouts and at most one quick retry on a dropped connection.

    Timeouts are never retried: the command may have run, and a blind retry of an append
    would apply it twice. The single retry on a connection error covers pooled connections
    left dead by a Redis restart.

    With `cluster`, a `RedisCluster` that has read the topology from the node at `url` (so
    this connects: `StoreUnavailable` if no node answers, `ConfigError` if the node is not in
    cluster mode). It follows MOVED and ASK redirections of single commands itself, but its
    own retries are off: they would also repeat timed-out commands, pipelines included. The
    store's calls retry instead, knowing which are safe to repeat (`guarded`, `guarded_read`).
    `max_connections` is per node.
    """
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": 30,
        # redis-py refuses a 101st connection by default: thread pools need more
        "max_connections": max_connections,
    }
    if cluster:
        return _cluster(url, common)
    retry = Retry(ExponentialBackoff(cap=0.1, base=0.01), 1, (redis.ConnectionError,))
    return redis.Redis.from_url(url, retry=retry, retry_on_timeout=False, **common)


def _cluster(url: str, common: dict[str, Any]) -> RedisCluster:
    options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    if "path" in options or options.get("db", 0) != 0:
        raise ConfigError(
            f"PREFIT_REDIS_CLUSTER=true needs REDIS_URL to name a node over TCP, database 0 "
            f"(a cluster has no other), not {redacted(url)}"
        )
    try:
        return RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), **common)
    except redis.exceptions.RedisClusterException as exc:
        if "Cluster mode is not enabled" in str(exc):
            raise ConfigError(mode_mismatch(url, cluster=True)) from None
        raise StoreUnavailable(f"redis cluster unavailable at {redacted(url)}") from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise StoreUnavailable(f"redis cluster unavailable: {type(exc).__name__}") from exc


def check_mode(client: Client, url: str) -> None:
    """`ConfigError` if Redis's cluster mode (`INFO cluster`) is not the client's kind.

    A `RedisCluster` cannot be made on a node that is not in cluster mode (`connect` says so),
    so this catches the other way round: a standalone client on a cluster node, whose every
    command on a key of another node would fail with MOVED.
    """
    clustered = isinstance(client, RedisCluster)
    enabled = bool(int(client.info("cluster").get("cluster_enabled", 0)))
    if enabled != clustered:
        raise ConfigError(mode_mismatch(url, cluster=clustered))


def mode_mismatch(url: str, *, cluster: bool) -> str:
    """The start-up error for a REDIS_URL whose cluster mode is not PREFIT_REDIS_CLUSTER's."""
    if cluster:
        return (
            f"PREFIT_REDIS_CLUSTER=true but REDIS_URL {redacted(url)} is not a Redis Cluster "
            "node (INFO cluster: cluster_enabled:0): point REDIS_URL at a node of the cluster, "
            "or unset PREFIT_REDIS_CLUSTER for a standalone Redis"
        )
    return (
        f"REDIS_URL {redacted(url)} is a Redis Cluster node (INFO cluster: cluster_enabled:1) "
        "but PREFIT_REDIS_CLUSTER is not set: set PREFIT_REDIS_CLUSTER=true, or point "
        "REDIS_URL at a standalone Redis"
    )


def redacted(url: str) -> str:
    """`url` without its password (for errors and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def eval_in(pipe: Any, script: str, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue `script` (EVAL) in a pipeline of either client: a cluster pipeline routes it by
    its keys, which must share one slot, but has no `eval` method of its own."""
    pipe.execute_command("EVAL", script, len(keys), *keys, *args)


# Faults of the store rather than of the request: the same call may succeed later.
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # includes BusyLoadingError (restarting) and auth failures
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a replica, e.g. during failover
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ClusterError,  # redirections went round until their limit (resharding)
    redis.exceptions.SlotNotCoveredError,  # the topology changed under the client
    redis.exceptions.AskError,  # MOVED too: a cluster transaction does not follow redirections
    # a script unknown to the node that got it: a new primary after a failover, whose script
    # cache is empty, reached before the client has the new slot map to load it there
    redis.exceptions.NoScriptError,
)

# What a guarded call catches: the faults, and redis-py's cluster client failing to read a
# slot map (`topology_fault`; its other exceptions are bugs and pass).
CAUGHT: tuple[type[Exception], ...] = (*UNAVAILABLE, RedisClusterException)
CAUGHT_ASYNC: tuple[type[Exception], ...] = (*CAUGHT, OSError)  # asyncio's sockets raise these
# an asyncio read also sees the loop's RuntimeError for a closed socket (`closed_transport`)
CAUGHT_READ_ASYNC: tuple[type[Exception], ...] = (*CAUGHT_ASYNC, RuntimeError)

# Refusals: the node did not run the command (a redirection, a failover under way, a replica
# refusing a write, a node still loading), so running it again cannot apply it twice.
REFUSED: tuple[type[Exception], ...] = (
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ClusterError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.NoScriptError,
)

# How long a call on a cluster client may retry when no request deadline says otherwise (a
# worker): enough for a redirection after a failover, short because a worker's jobs share one
# event loop that a retrying call holds; a job that still fails is retried by Celery.
RETRY_BUDGET_S = 0.5
RETRY_MARGIN_S = 0.3  # kept for the last attempt itself
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 0.4

# The seconds left to the current request's deadline (the API sets it per request, and
# threadpool calls inherit it); None: RETRY_BUDGET_S from the call's start.
_remaining: ContextVar[Callable[[], float] | None] = ContextVar("prefit_retry", default=None)


def request_time_left() -> float | None:
    """The seconds left to the current request's deadline (`retry_within`); None outside a
    request (a worker)."""
    found = _remaining.get()
    return found() if found is not None else None


def retry_within(remaining: Callable[[], float]) -> None:
    """Bound the store's retries in this context (and the tasks and threads it starts) by
    `remaining()`, the seconds left to a deadline."""
    _remaining.set(remaining)


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Map faults of the store to `StoreUnavailable`; on a cluster, retry refusals first.

    For calls that write: only what the node refused (`REFUSED`) or a connection that was
    never made is retried, after reading the topology again, so a write never lands twice.
    """
    return _retrying(fn, reads=False)


def guarded_read(fn: Callable[P, R]) -> Callable[P, R]:
    """`guarded` for calls that only read: any fault of the store is retried on a cluster (a
    connection dropped mid-read, a timeout), since running a read again changes nothing."""
    return _retrying(fn, reads=True)


def guarded_once(fn: Callable[P, R]) -> Callable[P, R]:
    """`guarded` without the retry, for a write that one pipeline sends to several cluster
    nodes: one node may apply its part while another refuses, so running it again would apply
    that part twice (usage counted twice, a claim finding its own lease)."""
    return _retrying(fn, reads=False, retry=False)


def _retrying(fn: Callable[P, R], *, reads: bool, retry: bool = True) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        client = getattr(args[0], "_r", None) if args else None
        cluster = isinstance(client, RedisCluster)
        left = _clock()
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except CAUGHT as exc:
                if isinstance(exc, RedisClusterException) and not topology_fault(exc):
                    raise  # a bug (a command crossing slots), not a fault of the cluster
                if cluster:  # whatever happens next, the next call must not use a stale map
                    refresh(client)
                again = retry and cluster and retryable(exc, reads=reads)
                time.sleep(_pause(exc, attempt, left, again))
                attempt += 1

    return wrapper


async def guarded_read_async(read: Callable[[], Awaitable[R]], client: Any) -> R:
    """`guarded_read` for an asyncio read on `client`: on an asyncio cluster client any fault
    is retried (after reading the slot map again) while the deadline allows."""
    cluster = isinstance(client, AsyncRedisCluster)
    left = _clock()
    attempt = 0
    while True:
        try:
            return await read()
        except CAUGHT_READ_ASYNC as exc:
            if isinstance(exc, RedisClusterException) and not topology_fault(exc):
                raise
            if isinstance(exc, RuntimeError) and not closed_transport(exc):
                raise
            await asyncio.sleep(_pause(exc, attempt, left, cluster))
            if _refresh_due(client):
                with contextlib.suppress(redis.RedisError, RedisClusterException, OSError):
                    await client.nodes_manager.initialize()
            attempt += 1


def _pause(exc: BaseException, attempt: int, left: Callable[[], float], again: bool) -> float:
    """The backoff before attempt `attempt + 1` of a call that failed with `exc`; raises
    `StoreUnavailable` when it may not run `again` or the time left cannot hold the pause."""
    pause: float = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0**attempt)
    if not (again and left() > pause + RETRY_MARGIN_S):
        raise StoreUnavailable(f"redis unavailable: {type(exc).__name__}") from exc
    log.info("store.retried", error=type(exc).__name__, attempt=attempt + 1)
    return pause


def _clock() -> Callable[[], float]:
    """The seconds left for retries of a call starting now."""
    found = _remaining.get()
    if found is not None:
        return found
    until = time.monotonic() + RETRY_BUDGET_S
    return lambda: until - time.monotonic()


def closed_transport(exc: BaseException) -> bool:
    """Whether `exc` is the event loop refusing a write on a socket already closed (uvloop and
    asyncio raise RuntimeError, which redis-py's asyncio connection passes on as it is, when a
    killed node's connection is health-checked): a lost connection, not a bug."""
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)


def topology_fault(exc: BaseException) -> bool:
    """Whether redis-py's cluster client failed to read a usable slot map (no node answered,
    slots uncovered or disagreed on, mid-failover), as opposed to refusing a command."""
    return isinstance(exc, RedisClusterException) and str(exc).startswith(TOPOLOGY_FAULTS)


TOPOLOGY_FAULTS = (
    "Redis Cluster cannot be connected",
    "All slots are not covered",
    "startup_nodes could not agree",
)


def retryable(exc: BaseException, *, reads: bool) -> bool:
    """Whether running the call again is safe: always for a read, and for a write when the
    node refused it or no connection was made (the command was never sent)."""
    return reads or isinstance(exc, REFUSED) or topology_fault(exc) or never_sent(exc)


def never_sent(exc: BaseException) -> bool:
    """A connection error raised while connecting (refused, unreachable, connect timeout)."""
    if not isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return False
    message = str(exc)
    return "connecting to" in message or message.startswith("Timeout connecting")


REFRESH_EVERY_S = 0.1  # at most one topology read per client per this, however many calls fail
_refreshed: dict[int, float] = {}
_refresh_lock = threading.Lock()


def refresh(client: Any) -> None:
    """Read a cluster's slot map again (a failover or a resharding moved slots), unless it was
    read in the last REFRESH_EVERY_S; a no-op for a standalone client, or when no node answers
    (the next attempt reports that)."""
    if not isinstance(client, RedisCluster) or not _refresh_due(client):
        return
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError) as exc:
        log.info("store.topology_unread", error=type(exc).__name__)


def _refresh_due(client: Any) -> bool:
    """Whether `client`'s slot map may be read again now (see `REFRESH_EVERY_S`); if so, the
    read is counted as done."""
    now = time.monotonic()
    with _refresh_lock:
        if now - _refreshed.get(id(client), -REFRESH_EVERY_S) < REFRESH_EVERY_S:
            return False
        _refreshed[id(client)] = now
        return True


def ttl_ms(seconds: float) -> int:
    """A positive TTL in milliseconds; `ConfigError` for zero, negative or non-finite ones."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"ttl must be a positive number of seconds, got {seconds!r}")
    return max(1, round(seconds * 1000))


def text(value: bytes | str) -> str:
    """A Redis reply as str (the client does not decode, so message bytes stay exact)."""
    return value.decode() if isinstance(value, bytes) else value
