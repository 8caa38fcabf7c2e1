"""Summarizer providers over HTTP, and the factory that builds the configured one.

Usage: `client = client_from_settings(settings)` gives None when no provider is configured
(use `shared.summaries.extractive.ExtractiveSummarizer` then); otherwise
`await client.complete(messages, model=None, max_tokens=1200)` (None: the configured
model) and `await client.aclose()` at shutdown. Errors: `LLMError` (not worth retrying),
`RetryableLLMError` (retry later, after `retry_after` seconds when the provider said so),
`ContextLengthExceeded` (retry with a smaller input); see `shared.providers.retry`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx

from shared.providers.anthropic import AnthropicClient
from shared.providers.base import ProviderClient, http_timeout
from shared.providers.openai import OpenAIClient
from shared.providers.pricing import PriceTable
from shared.providers.retry import RetryPolicy, Sleep, parse_retry_after
from shared.settings import Settings

__all__ = [
    "AnthropicClient",
    "OpenAIClient",
    "PriceTable",
    "ProviderClient",
    "RetryPolicy",
    "client_from_settings",
    "http_timeout",
    "parse_retry_after",
]


def client_from_settings(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    sleep: Sleep = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> ProviderClient | None:
    """The configured provider client, or None when `summarizer_url` is unset.

    The pool is sized for `worker_concurrency` calls in flight at once (at least 100).
    """
    if not settings.summarizer_url:
        return None
    key = settings.summarizer_api_key
    cls: type[ProviderClient] = (
        AnthropicClient if settings.summarizer_protocol == "anthropic" else OpenAIClient
    )
    return cls(
        settings.summarizer_url,
        key.get_secret_value() if key is not None else None,
        timeout=http_timeout(settings.summarizer_timeout_s, settings.summarizer_connect_timeout_s),
        max_attempts=settings.summarizer_max_attempts,
        max_inline_wait_s=settings.summarizer_max_inline_wait_s,
        prices=settings.prices,
        transport=transport,
        default_model=settings.summarizer_model,
        sleep=sleep,
        rand=rand,
        max_connections=max(100, settings.worker_concurrency),
    )
