"""Retries shared by every provider: which failures to retry, how long to wait, when to give up.

Retried: 408, 409, 429, every 5xx (529 "overloaded" included), timeouts and connection
failures. Never retried: any other 4xx (400, 401, 403, 404, 422, ...), raised at once as
`LLMError`, and context-length errors, raised as `ContextLengthExceeded` for the caller to
retry with smaller chunks. Waits: the provider's own `retry-after-ms`, else `retry-after`
(seconds or an HTTP-date), else exponential backoff with full jitter. A wait longer than
`max_inline_wait_s` is not slept here: `RetryableLLMError(retry_after=...)` is raised so a
Celery task can retry later with a countdown instead of holding a worker slot.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from shared.errors import ConfigError, LLMError, RetryableLLMError
from shared.logs import get_logger

Sleep = Callable[[float], Awaitable[None]]
Classify = Callable[[httpx.Response], LLMError]

RETRYABLE_STATUSES = frozenset({408, 409, 429})
# Transport failures after which the same request may well succeed.
RETRYABLE_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


def _log() -> Any:
    # fetched per call, not cached at import: a logger bound at import would ignore
    # structlog configuration made later (and structlog.testing.capture_logs)
    return get_logger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one request."""

    max_attempts: int = 4
    max_inline_wait_s: float = 10.0
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_inline_wait_s < 0 or self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ConfigError("retry waits must be >= 0")

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Full-jitter delay after failed attempt number `attempt` (1-based)."""
        growth = self.base_delay_s * 2.0 ** (attempt - 1)
        cap = min(self.max_delay_s, self.max_inline_wait_s, growth)
        return cap * rand()


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the provider asks to wait: `retry-after-ms`, else `retry-after`; None if absent."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT by definition
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


async def send_with_retry(
    send: Callable[[], Awaitable[httpx.Response]],
    *,
    provider: str,
    classify: Classify,
    policy: RetryPolicy,
    sleep: Sleep = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> httpx.Response:
    """Call `send` until it gives a 2xx response, following the rules of this module.

    `classify` turns an error response into the error to raise (a `RetryableLLMError`
    for the statuses worth retrying); it never looks at the request, so no prompt text
    can end up in an exception.
    """
    for attempt in range(1, policy.max_attempts + 1):
        outcome = await _attempt(send, provider=provider, classify=classify)
        if isinstance(outcome, httpx.Response):
            return outcome
        wait = outcome.retry_after
        if attempt == policy.max_attempts:
            _log().warning(
                "llm.gave_up", provider=provider, attempts=attempt, status=outcome.status
            )
            raise RetryableLLMError(
                f"{outcome} (gave up after {attempt} attempts)",
                status=outcome.status,
                retry_after=wait,
            )
        if wait is not None and wait > policy.max_inline_wait_s:
            _log().info("llm.deferred", provider=provider, status=outcome.status, retry_after=wait)
            raise RetryableLLMError(
                f"{outcome} (provider asks to wait {wait:.1f}s, more than the "
                f"{policy.max_inline_wait_s:g}s waited inline)",
                status=outcome.status,
                retry_after=wait,
            )
        delay = wait if wait is not None else policy.backoff(attempt, rand)
        _log().info(
            "llm.retried", provider=provider, status=outcome.status, attempt=attempt, delay=delay
        )
        await sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


async def _attempt(
    send: Callable[[], Awaitable[httpx.Response]], *, provider: str, classify: Classify
) -> httpx.Response | RetryableLLMError:
    """One try: the 2xx response, or the error worth retrying (with the provider's wait); raises."""
    try:
        response = await send()
    except RETRYABLE_EXCEPTIONS as exc:
        return RetryableLLMError(f"{provider}: request failed: {type(exc).__name__}")
    except httpx.HTTPError as exc:
        raise LLMError(f"{provider}: request could not be sent: {type(exc).__name__}") from exc
    if response.is_success:
        return response
    error = classify(response)
    if not isinstance(error, RetryableLLMError):
        _log().warning("llm.rejected", provider=provider, status=response.status_code)
        raise error
    error.retry_after = parse_retry_after(response.headers)
    return error
