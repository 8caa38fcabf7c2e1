"""What every HTTP provider client shares: pooled connections, retries, error mapping, cost.

Subclasses only say how to build a request and how to read an answer. Exception messages
name the provider, the HTTP status and the provider's error type/code (when they are plain
identifiers) and never the provider's free-text message: some servers echo the input in
it, and the input is the conversation.
"""

from __future__ import annotations

import abc
import asyncio
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from shared.errors import ConfigError, ContextLengthExceeded, LLMError, RetryableLLMError
from shared.messages import Message
from shared.providers.pool import ShardedPool
from shared.providers.pricing import PriceLike, PriceTable
from shared.providers.retry import RetryPolicy, Sleep, is_retryable_status, send_with_retry
from shared.summaries.llm import Completion

_IDENT = re.compile(r"^[\w.\-]{1,64}$")
_HINTS = {
    400: "bad request",
    401: "authentication failed: check the API key (PREFIT_SUMMARIZER_API_KEY)",
    403: "permission denied for this key or model",
    404: "not found: check PREFIT_SUMMARIZER_URL and the model name",
    408: "request timeout",
    409: "conflict",
    422: "request rejected as unprocessable",
    429: "rate limited",
    529: "provider overloaded",
}


@dataclass(frozen=True)
class ErrorInfo:
    """The machine-readable parts of a provider's error body (the message is for matching only)."""

    type: str | None = None
    code: str | None = None
    param: str | None = None
    message: str = ""

    @classmethod
    def of(cls, response: httpx.Response) -> ErrorInfo:
        try:
            body: Any = response.json()
        except ValueError:
            return cls()
        if not isinstance(body, dict):
            return cls()
        err = body.get("error", body)  # vLLM used to put the fields at the top level
        if isinstance(err, str):
            return cls(message=err)
        if not isinstance(err, dict):
            return cls()
        message = err.get("message")
        return cls(
            type=_ident(err.get("type")),
            code=_ident(err.get("code")),
            param=_ident(err.get("param")),
            message=message if isinstance(message, str) else "",
        )

    def fields(self) -> list[str]:
        """`key=value` for each identifier-like field the provider sent."""
        pairs = (("type", self.type), ("code", self.code), ("param", self.param))
        return [f"{k}={v}" for k, v in pairs if v]


def _ident(value: Any) -> str | None:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    return text if text is not None and _IDENT.match(text) else None


def http_timeout(total_s: float, connect_s: float) -> httpx.Timeout:
    """Connect fails fast; reading a long completion, writing and waiting for the pool may not."""
    return httpx.Timeout(connect=connect_s, read=total_s, write=total_s, pool=total_s)


class ProviderClient(abc.ABC):
    """An `LLMClient` over pooled HTTP connections (`ShardedPool`); call `aclose()` when done."""

    protocol: ClassVar[str] = "?"

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: httpx.Timeout,
        max_attempts: int = 4,
        max_inline_wait_s: float = 10.0,
        prices: Mapping[str, PriceLike] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        default_model: str | None = None,
        sleep: Sleep = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        max_connections: int = 1000,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.protocol}: base URL must start with http:// or https://")
        self.base_url = self.root_of(base_url)
        self.default_model = default_model
        self.prices = PriceTable.of(prices or {})
        self.policy = RetryPolicy(max_attempts=max_attempts, max_inline_wait_s=max_inline_wait_s)
        self._api_key = api_key or None
        self.pool = ShardedPool(
            timeout=timeout, max_connections=max_connections, transport=transport
        )
        self._sleep = sleep
        self._rand = rand

    async def complete(
        self, messages: Sequence[Message], *, model: str | None, max_tokens: int
    ) -> Completion:
        """One completion, retried per `shared.providers.retry`; cost from the price table."""
        chosen = model or self.default_model
        if not chosen:
            raise ConfigError(f"{self.protocol}: no model given and PREFIT_SUMMARIZER_MODEL unset")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
        path, headers, payload = self.build_request(messages, chosen, max_tokens)
        url = self.base_url + path
        response = await send_with_retry(
            lambda: self.pool.post(url, headers=headers, json=payload),
            provider=self.protocol,
            classify=lambda r: self.classify(r, chosen),
            policy=self.policy,
            sleep=self._sleep,
            rand=self._rand,
        )
        text, input_tokens, output_tokens, reported = self.parse(_json_of(response, self.protocol))
        cost = self.prices.cost(chosen, input_tokens, output_tokens, reported=reported)
        return Completion(text, input_tokens, output_tokens, cost, reported or chosen)

    async def aclose(self) -> None:
        await self.pool.aclose()

    @staticmethod
    def root_of(base_url: str) -> str:
        """The URL that request paths are appended to."""
        return base_url.rstrip("/")

    @abc.abstractmethod
    def build_request(
        self, messages: Sequence[Message], model: str, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        """(path under base_url, headers, JSON body)."""

    @abc.abstractmethod
    def parse(self, body: dict[str, Any]) -> tuple[str, int, int, str | None]:
        """(text, input tokens, output tokens, model the provider reports)."""

    @abc.abstractmethod
    def is_context_error(self, status: int, info: ErrorInfo) -> bool:
        """Whether an error response means the input was too long for the model."""

    def classify(self, response: httpx.Response, model: str) -> LLMError:
        """The error an unsuccessful response stands for (retryable or not)."""
        status = response.status_code
        info = ErrorInfo.of(response)
        details = [f"model {model!r}", *info.fields()]
        request_id = response.headers.get("x-request-id") or response.headers.get("request-id")
        if request_id and _IDENT.match(request_id):
            details.append(f"request id {request_id}")
        if self.is_context_error(status, info):
            return ContextLengthExceeded(
                f"{self.protocol}: HTTP {status}: the summarizer input exceeds the model's "
                f"context window ({', '.join(details)})",
                status=status,
            )
        hint = _HINTS.get(status) or _hint_by_class(status)
        message = f"{self.protocol}: HTTP {status}: {hint} ({', '.join(details)})"
        if is_retryable_status(status):
            return RetryableLLMError(message, status=status)
        return LLMError(message, status=status)


def _hint_by_class(status: int) -> str:
    if status >= 500:
        return "provider error"
    if 300 <= status < 400:  # redirects are not followed: the URL is wrong (http vs https?)
        return "redirected: check PREFIT_SUMMARIZER_URL"
    return "request failed"


def _json_of(response: httpx.Response, provider: str) -> dict[str, Any]:
    try:
        body: Any = response.json()
    except ValueError:
        raise LLMError(f"{provider}: answer is not JSON", status=response.status_code) from None
    if not isinstance(body, dict):
        raise LLMError(f"{provider}: answer is not a JSON object", status=response.status_code)
    return body


def usage_int(usage: Any, key: str) -> int:
    """A token count from a usage block; 0 when a (local) server does not report it."""
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
