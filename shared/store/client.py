"""The Redis client the store runs on, and the one place Redis faults become `StoreUnavailable`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared.errors import ConfigError, StoreUnavailable

P = ParamSpec("P")
R = TypeVar("R")

SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0


def connect(
    url: str,
    *,
    socket_timeout: float = SOCKET_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    max_connections: int | None = None,
) -> redis.Redis:
    """A client with explicit timeouts and at most one quick retry on a dropped connection.

    Timeouts are never retried: the command may have run, and a blind retry of an append
    would apply it twice. The single retry on a connection error covers pooled connections
    left dead by a Redis restart.
    """
    retry = Retry(ExponentialBackoff(cap=0.1, base=0.01), 1, (redis.ConnectionError,))
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=retry,
        retry_on_timeout=False,
        health_check_interval=30,
        # redis-py refuses a 101st connection by default: thread pools need more
        max_connections=max_connections,
    )


# Faults of the store rather than of the request: the same call may succeed later.
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # includes BusyLoadingError (restarting) and auth failures
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a replica, e.g. during failover
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
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
