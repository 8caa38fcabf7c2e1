"""The summarizer's provider interface: what the Summarize strategy and the workers call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from shared.messages import Message


@dataclass(frozen=True)
class Completion:
    """One provider answer with what it cost.

    - text: the answer's text;
    - input_tokens, output_tokens: the tokens the provider billed for it;
    - cost: what it cost (the providers' price table is in USD; 0.0: unknown or free);
    - model: the model that answered, when known.
    """

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    model: str | None = None


class LLMClient(Protocol):
    """A chat-completions provider (OpenAI-compatible, Anthropic, or a fake in tests)."""

    async def complete(
        self, messages: Sequence[Message], *, model: str | None, max_tokens: int
    ) -> Completion:
        """The answer to `messages` from `model` (None: the client's default), in at most
        `max_tokens` tokens."""
        ...


# The reference's `summarize=` hook: (prompt, model) -> summary text.
SummarizeFn: TypeAlias = Callable[[str, str | None], Awaitable[str]]
