"""`AsyncPrefitClient`: the asyncio client of the prefit HTTP API."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import httpx

from shared.client.calls import (
    AppendResult,
    Call,
    ConversationInfo,
    Health,
    PreparedPrompt,
    append_call,
    delete_call,
    get_call,
    health_result,
    observe_call,
    prepare_call,
    prepare_messages_call,
    replace_call,
)
from shared.client.retrying import DEFAULT_URL, Retrying
from shared.messages import Message, ToolSpec

T = TypeVar("T")
Format = Literal["openai", "anthropic"]
_async_sleep = asyncio.sleep  # module-level so tests can wait without waiting


class AsyncPrefitClient(Retrying):
    """The same API as `PrefitClient`, awaitable; use `async with` or `await aclose()`.

    Its constructor and methods take `PrefitClient`'s parameters, which its docstrings
    describe (`transport` here is an `httpx.AsyncBaseTransport`).
    """

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
        """Append messages to a conversation (created on first append).

        Parameters: as for `PrefitClient.append`.
        """
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
        expected_length: int | None = None,
    ) -> AppendResult:
        """Replace a conversation's whole transcript (409 `LengthMismatch` unless the stored
        length is `expected_length`, when given: an edit based on what was read).

        Parameters: as for `PrefitClient.replace`.
        """
        return await self._call(
            replace_call(
                conv_id, messages, model, max_input_tokens, tools, format, system, expected_length
            )
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
        wait_ms: int | None = None,
        max_input_tokens: int | None = None,
        format: Format = "openai",
    ) -> PreparedPrompt:
        """The prompt to send now for a stored conversation; `wait_ms` (None: the service's
        PREFIT_DEFAULT_WAIT_MS) lets it wait that long for a due summary.

        Parameters: as for `PrefitClient.prepare`.
        """
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
        """The prompt to send for a transcript the service does not store.

        Parameters: as for `PrefitClient.prepare_messages`.
        """
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
        with `format="anthropic"`, `messages`, `system` and `tools` as Anthropic sent them.

        Parameters: as for `PrefitClient.observe`.
        """
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
                response = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    timeout=self._timeout(call, self._http.timeout),
                )
            except httpx.TransportError as exc:
                delay: float | None = self._retry_transport(call, exc, attempt)
            else:
                delay = self._retry_status(call, response, attempt)
                if delay is None:
                    return call.finish(response)
            await _async_sleep(delay or 0.0)
            attempt += 1
