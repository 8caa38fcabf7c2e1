"""Helpers of the provider tests: a recording sleep, client construction, one-shot calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.messages import Message
from shared.providers import ProviderClient, http_timeout
from shared.summaries.llm import Completion

MESSAGES: list[Message] = [
    {"role": "system", "content": "You summarize conversations."},
    {"role": "user", "content": "Summarize: the user fixed src/app.py after a crash."},
]


class SleepRecorder:
    """An injectable sleep that only records how long it was asked to wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def make(
    cls: type[ProviderClient],
    base_url: str,
    sleeper: SleepRecorder,
    *,
    api_key: str | None = None,
    read_s: float = 5.0,
    **kwargs: Any,
) -> ProviderClient:
    """A client with fast timeouts, a recorded sleep and fixed jitter (half the cap)."""
    kwargs.setdefault("max_attempts", 4)
    kwargs.setdefault("max_inline_wait_s", 10.0)
    return cls(
        base_url,
        api_key,
        timeout=http_timeout(read_s, 2.0),
        sleep=sleeper,
        rand=lambda: 0.5,
        **kwargs,
    )


async def complete(
    client: ProviderClient,
    messages: Sequence[Message] = MESSAGES,
    *,
    model: str | None = "test-model",
    max_tokens: int = 100,
) -> Completion:
    """Run one completion and close the client's pool."""
    try:
        return await client.complete(messages, model=model, max_tokens=max_tokens)
    finally:
        await client.aclose()
