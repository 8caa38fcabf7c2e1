"""What both clients share: which failures to retry, and how long to wait before the next try.

A 503 or a refused connection is retried with exponential backoff (honouring `Retry-After`);
a request that may have reached the service (read timeout, dropped connection, or a 503 from
the request deadline, whose body says `"outcome": "unknown"`) is retried only when repeating
it is harmless (`Call.idempotent`).
"""

from __future__ import annotations

import random
import time
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from shared.client.calls import Call, unreachable
from shared.logs import get_logger

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_RETRY_AFTER_S = 60.0  # a Retry-After honoured up to this; past it, our own backoff
# Connection attempts that failed before any byte was sent: always safe to repeat.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
log = get_logger(__name__)


class Retrying:
    """The retry rules of one client: attempts, backoff, and what may be repeated.

    - base_url, api_key, retries, backoff, max_backoff: as for `PrefitClient`.
    """

    def __init__(
        self, base_url: str, api_key: str | None, retries: int, backoff: float, max_backoff: float
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._retries = max(0, retries)
        self._backoff = backoff
        self._max_backoff = max_backoff

    def _delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before retry `attempt + 1`, or None when no retry is due."""
        if attempt >= self._retries:
            return None
        if response is not None:
            stated = _retry_after(response.headers.get("Retry-After"))
            if stated is not None and stated <= MAX_RETRY_AFTER_S:
                return stated  # longer ones (a misconfigured proxy): our own backoff
        step = min(self._max_backoff, self._backoff * 2.0**attempt)
        return step * (0.5 + random.random() / 2)  # jitter: replicas must not retry in step

    def _timeout(self, call: Call[Any], timeout: httpx.Timeout) -> httpx.Timeout:
        """The client's timeout, its read extended by what the call lets the service wait."""
        if not call.wait_s or timeout.read is None:
            return timeout
        return httpx.Timeout(
            connect=timeout.connect,
            read=timeout.read + call.wait_s,
            write=timeout.write,
            pool=timeout.pool,
        )

    def _retry_transport(self, call: Call[Any], exc: httpx.TransportError, attempt: int) -> float:
        delay = self._delay(attempt, None)
        if delay is None or not (isinstance(exc, _NOT_SENT) or call.idempotent):
            sent = not isinstance(exc, _NOT_SENT) and not call.idempotent
            raise unreachable(self.base_url, exc, sent=sent) from exc
        log.info("client.retried", path=call.path, attempt=attempt + 1, error=type(exc).__name__)
        return delay

    def _retry_status(
        self, call: Call[Any], response: httpx.Response, attempt: int
    ) -> float | None:
        if response.status_code != 503:
            return None
        if not call.idempotent and _outcome_unknown(response):
            return None  # it may still land: repeating could apply it twice
        delay = self._delay(attempt, response)
        if delay is not None:
            log.info("client.retried", path=call.path, attempt=attempt + 1, status=503)
        return delay


def _outcome_unknown(response: httpx.Response) -> bool:
    """Whether an error answer says the request may have been applied anyway."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("outcome") == "unknown"


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
