"""Python client of the prefit HTTP API: `PrefitClient` (sync) and `AsyncPrefitClient` (async).

Both speak the contract of docs/design.md, return frozen dataclasses, and raise the typed
errors of shared/errors.py from the service's `{"error": {"type", "message", ...}}` bodies.
A 503 or a refused connection is retried with exponential backoff (honouring `Retry-After`);
a request that may have reached the service (read timeout, dropped connection, or a 503 from
the request deadline, whose body says `"outcome": "unknown"`) is retried only when repeating
it is harmless: reads, prepare, replace, delete, and appends that state `expected_length`
(a repeat then fails with `LengthMismatch` instead of appending twice).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

import httpx

from shared.client_calls import (
    AppendResult,
    Call,
    ConversationInfo,
    Health,
    PreparedPrompt,
    SummaryInfo,
    append_call,
    delete_call,
    error_from_response,
    get_call,
    health_result,
    observe_call,
    prepare_call,
    prepare_messages_call,
    replace_call,
    unreachable,
)
from shared.logs import get_logger
from shared.messages import Message, ToolSpec

__all__ = [
    "AppendResult",
    "AsyncPrefitClient",
    "ConversationInfo",
    "Health",
    "PrefitClient",
    "PreparedPrompt",
    "SummaryInfo",
    "error_from_response",
]

T = TypeVar("T")
Format = Literal["openai", "anthropic"]
DEFAULT_URL = "http://127.0.0.1:8000"
# Connection attempts that failed before any byte was sent: always safe to repeat.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
log = get_logger(__name__)
_sleep = time.sleep  # module-level so tests can wait without waiting
_async_sleep = asyncio.sleep


class _Base:
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
            if stated is not None:
                return stated
        step = min(self._max_backoff, self._backoff * 2.0**attempt)
        return step * (0.5 + random.random() / 2)  # jitter: replicas must not retry in step

    def _retry_transport(self, call: Call[Any], exc: httpx.TransportError, attempt: int) -> float:
        delay = self._delay(attempt, None)
        if delay is None or not (isinstance(exc, _NOT_SENT) or call.idempotent):
            raise unreachable(self.base_url, exc) from exc
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


class PrefitClient(_Base):
    """Blocking client; use as a context manager or call `close()`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
    ) -> None:
        super().__init__(base_url, api_key, retries, backoff, max_backoff)
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=timeout, transport=transport
        )

    def append(
        self,
        conv_id: str,
        messages: Sequence[Message],
        *,
        model: str,
        expected_length: int | None = None,
        max_input_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> AppendResult:
        """Append messages to a conversation (created on first append)."""
        return self._call(
            append_call(
                conv_id, messages, model, expected_length, max_input_tokens, tools, format, system
            )
        )

    def replace(
        self,
        conv_id: str,
        messages: Sequence[Message],
        *,
        model: str,
        max_input_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> AppendResult:
        """Replace a conversation's whole transcript."""
        return self._call(
            replace_call(conv_id, messages, model, max_input_tokens, tools, format, system)
        )

    def get(self, conv_id: str) -> ConversationInfo:
        """Length, tokens, model and known summaries of a conversation."""
        return self._call(get_call(conv_id))

    def delete(self, conv_id: str) -> None:
        """Delete a conversation and its summaries."""
        self._call(delete_call(conv_id))

    def prepare(
        self,
        conv_id: str,
        *,
        model: str,
        tools: Sequence[ToolSpec] = (),
        pressure: float = 1.0,
        wait_ms: int = 0,
        max_input_tokens: int | None = None,
        format: Format = "openai",
    ) -> PreparedPrompt:
        """The prompt to send now for a stored conversation."""
        return self._call(
            prepare_call(conv_id, model, tools, pressure, wait_ms, max_input_tokens, format)
        )

    def prepare_messages(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        tools: Sequence[ToolSpec] = (),
        pressure: float = 1.0,
        max_input_tokens: int | None = None,
        format: Format = "openai",
        system: Any = None,
    ) -> PreparedPrompt:
        """The prompt to send for a transcript the service does not store."""
        return self._call(
            prepare_messages_call(
                messages, model, tools, pressure, max_input_tokens, format, system
            )
        )

    def observe(
        self,
        *,
        model: str,
        messages: Sequence[Message],
        actual_prompt_tokens: int,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> None:
        """Report the provider's real prompt-token count for what was sent (calibration);
        with `format="anthropic"`, `messages`, `system` and `tools` as Anthropic sent them."""
        self._call(observe_call(model, messages, tools, actual_prompt_tokens, format, system))

    def health(self) -> Health:
        """`/healthz`, once, without retries; never raises for an unreachable service."""
        try:
            return health_result(self._http.get("/healthz"))
        except httpx.TransportError as exc:
            return Health(ok=False, status=0, detail={"error": type(exc).__name__})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrefitClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.body)
            except httpx.TransportError as exc:
                delay: float | None = self._retry_transport(call, exc, attempt)
            else:
                delay = self._retry_status(call, response, attempt)
                if delay is None:
                    return call.finish(response)
            _sleep(delay or 0.0)
            attempt += 1


class AsyncPrefitClient(_Base):
    """The same API as `PrefitClient`, awaitable; use `async with` or `await aclose()`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
    ) -> None:
        super().__init__(base_url, api_key, retries, backoff, max_backoff)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=timeout, transport=transport
        )

    async def append(
        self,
        conv_id: str,
        messages: Sequence[Message],
        *,
        model: str,
        expected_length: int | None = None,
        max_input_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> AppendResult:
        """Append messages to a conversation (created on first append)."""
        return await self._call(
            append_call(
                conv_id, messages, model, expected_length, max_input_tokens, tools, format, system
            )
        )

    async def replace(
        self,
        conv_id: str,
        messages: Sequence[Message],
        *,
        model: str,
        max_input_tokens: int | None = None,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> AppendResult:
        """Replace a conversation's whole transcript."""
        return await self._call(
            replace_call(conv_id, messages, model, max_input_tokens, tools, format, system)
        )

    async def get(self, conv_id: str) -> ConversationInfo:
        """Length, tokens, model and known summaries of a conversation."""
        return await self._call(get_call(conv_id))

    async def delete(self, conv_id: str) -> None:
        """Delete a conversation and its summaries."""
        await self._call(delete_call(conv_id))

    async def prepare(
        self,
        conv_id: str,
        *,
        model: str,
        tools: Sequence[ToolSpec] = (),
        pressure: float = 1.0,
        wait_ms: int = 0,
        max_input_tokens: int | None = None,
        format: Format = "openai",
    ) -> PreparedPrompt:
        """The prompt to send now for a stored conversation."""
        return await self._call(
            prepare_call(conv_id, model, tools, pressure, wait_ms, max_input_tokens, format)
        )

    async def prepare_messages(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        tools: Sequence[ToolSpec] = (),
        pressure: float = 1.0,
        max_input_tokens: int | None = None,
        format: Format = "openai",
        system: Any = None,
    ) -> PreparedPrompt:
        """The prompt to send for a transcript the service does not store."""
        return await self._call(
            prepare_messages_call(
                messages, model, tools, pressure, max_input_tokens, format, system
            )
        )

    async def observe(
        self,
        *,
        model: str,
        messages: Sequence[Message],
        actual_prompt_tokens: int,
        tools: Sequence[ToolSpec] = (),
        format: Format = "openai",
        system: Any = None,
    ) -> None:
        """Report the provider's real prompt-token count for what was sent (calibration);
        with `format="anthropic"`, `messages`, `system` and `tools` as Anthropic sent them."""
        await self._call(observe_call(model, messages, tools, actual_prompt_tokens, format, system))

    async def health(self) -> Health:
        """`/healthz`, once, without retries; never raises for an unreachable service."""
        try:
            return health_result(await self._http.get("/healthz"))
        except httpx.TransportError as exc:
            return Health(ok=False, status=0, detail={"error": type(exc).__name__})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPrefitClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(call.method, call.path, json=call.body)
            except httpx.TransportError as exc:
                delay: float | None = self._retry_transport(call, exc, attempt)
            else:
                delay = self._retry_status(call, response, attempt)
                if delay is None:
                    return call.finish(response)
            await _async_sleep(delay or 0.0)
            attempt += 1


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
