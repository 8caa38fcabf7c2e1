"""`PrefitClient`: the blocking client of the prefit HTTP API."""

from __future__ import annotations

import time
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
_sleep = time.sleep  # module-level so tests can wait without waiting


class PrefitClient(Retrying):
    """Blocking client; use as a context manager or call `close()`.

    - base_url: the service's address (default "http://127.0.0.1:8000"; a trailing "/" is
      dropped);
    - api_key: sent as `Authorization: Bearer <api_key>`; None: no key (a service in open
      mode);
    - timeout: the httpx timeout of each request, in seconds (10.0); a prepare's read gets
      its `wait_ms` on top;
    - retries: how many times a failed request is tried again (3): after a 503 or a refused
      connection, and after a failure that may have reached the service only when repeating
      the request is harmless (see the package docstring);
    - transport: the httpx transport requests go through (None: the network; tests pass a
      mock one);
    - backoff: the wait before the first retry, in seconds (0.2), doubled for each next one,
      each wait jittered to 50-100% of it;
    - max_backoff: the longest such wait (5.0); a `Retry-After` of up to 60 s is honoured
      instead.

    What its methods share:
    - conv_id: the conversation's id, 1-128 letters, digits, ".", "_" or "-", starting with
      a letter or digit (`InvalidId` before anything is sent);
    - messages: OpenAI chat messages (Anthropic messages with `format="anthropic"`);
    - model: the model the prompt is for: its window (the service's `PREFIT_MODELS`) and
      its calibration ratio;
    - max_input_tokens: the model's input window for this request, overriding the
      service's `PREFIT_MODELS`;
    - tools: the tool specs sent with the prompt (they count in its tokens);
    - format: "openai" (default) or "anthropic": `messages`, `system` and `tools` in
      Anthropic's form, and a prepared prompt answered in it;
    - system: Anthropic's top-level system prompt, with `format="anthropic"` only
      (`ConfigError` otherwise); an append takes it only when it creates the conversation
      (`replace` changes it);
    - pressure: in (0, 1]; < 1 treats the estimate as 1/pressure times too small, to retry
      after the provider reported an overflow (as `ContextPolicy.prepare`).
    """

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
        """Append messages to a conversation (created on first append).

        - conv_id, messages, model, max_input_tokens, tools, format, system: see the class;
        - expected_length: the stored length these messages follow; another is 409
          `LengthMismatch` and writes nothing. With it, an append that may have reached the
          service is retried (a repeat fails instead of appending twice); without it, not.
        """
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
        expected_length: int | None = None,
    ) -> AppendResult:
        """Replace a conversation's whole transcript (409 `LengthMismatch` unless the stored
        length is `expected_length`, when given: an edit based on what was read).

        - conv_id, messages, model, max_input_tokens, tools, format, system: see the class.
        """
        return self._call(
            replace_call(
                conv_id, messages, model, max_input_tokens, tools, format, system, expected_length
            )
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
        wait_ms: int | None = None,
        max_input_tokens: int | None = None,
        format: Format = "openai",
    ) -> PreparedPrompt:
        """The prompt to send now for a stored conversation; `wait_ms` (None: the service's
        PREFIT_DEFAULT_WAIT_MS) lets it wait that long for a due summary.

        - conv_id, model, tools, pressure, max_input_tokens, format: see the class;
        - wait_ms: milliseconds the service may wait for a due summary (at most 60000); the
          read timeout grows by as much.
        """
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
        """The prompt to send for a transcript the service does not store.

        - messages, model, tools, pressure, max_input_tokens, format, system: see the class.
        """
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
        with `format="anthropic"`, `messages`, `system` and `tools` as Anthropic sent them.

        - model: the model that answered;
        - messages, tools: exactly what was sent (the prepared prompt, not the transcript);
        - actual_prompt_tokens: the provider's own prompt-token count for it (its usage);
        - format, system: see the class.
        """
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
                response = self._http.request(
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
            _sleep(delay or 0.0)
            attempt += 1
