"""The Redis client the store runs on, and the one place Redis faults become `StoreUnavailable`.

A standalone Redis gets a `redis.Redis`; a Redis Cluster (`PREFIT_REDIS_CLUSTER=true`) gets
redis-py's `RedisCluster`, which reads the cluster's topology from the node `REDIS_URL` names
when it is made and sends each command to the node serving its keys. Every script and MULTI
of the store touches one slot (shared/store/keys.py), so both clients run the same code, with one
difference in pipelines: a cluster pipeline has no `eval` method, so scripts go into
pipelines through `eval_in`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeAlias, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.retry import Retry

from shared.errors import ConfigError, StoreUnavailable

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
    cluster mode). It follows MOVED and ASK redirections itself, but retries nothing else:
    its retries would also repeat timed-out commands, pipelines included. A dropped pooled
    connection (a node restarted) then fails one command, and the next use re-reads the
    topology. `max_connections` is per node.
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
)


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Map faults of the store (unreachable, timeout, read-only, OOM) to `StoreUnavailable`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unavailable: {type(exc).__name__}") from exc

    return wrapper


def ttl_ms(seconds: float) -> int:
    """A positive TTL in milliseconds; `ConfigError` for zero, negative or non-finite ones."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"ttl must be a positive number of seconds, got {seconds!r}")
    return max(1, round(seconds * 1000))


def text(value: bytes | str) -> str:
    """A Redis reply as str (the client does not decode, so message bytes stay exact)."""
    return value.decode() if isinstance(value, bytes) else value
