"""OpenAI-compatible chat completions: api.openai.com, vLLM, Ollama, llama.cpp, LiteLLM...

`base_url` is the API root including its version, e.g. `https://api.openai.com/v1` or
`http://host:11434/v1`; requests go to `{base_url}/chat/completions`. Without an API key
no Authorization header is sent (local servers).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from shared.errors import LLMError
from shared.messages import Message, text_of
from shared.providers.base import ErrorInfo, ProviderClient, usage_int

# OpenAI ("maximum context length"), vLLM ("This model's maximum context length is ..."),
# llama.cpp ("exceeds the available context size"), LiteLLM / others ("context window").
_CONTEXT_MESSAGE = re.compile(r"context[ _](?:length|size|window|limit)|maximum context", re.I)
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})


class OpenAIClient(ProviderClient):
    """`LLMClient` for the OpenAI chat-completions protocol."""

    protocol: ClassVar[str] = "openai"

    # api.openai.com's reasoning models want "max_completion_tokens"; most servers "max_tokens".
    max_tokens_field: str = "max_tokens"

    def build_request(
        self, messages: Sequence[Message], model: str, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        payload = {"model": model, "messages": list(messages), self.max_tokens_field: max_tokens}
        return "/chat/completions", headers, payload

    def parse(self, body: dict[str, Any]) -> tuple[str, int, int, str | None]:
        choices = body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            raise LLMError("openai: answer has no choices[0].message", status=200)
        text = text_of(message)
        if not text.strip():
            reason = _finish_reason(first)
            raise LLMError(f"openai: empty completion (finish_reason={reason})", status=200)
        usage = body.get("usage")
        reported = body.get("model")
        return (
            text,
            usage_int(usage, "prompt_tokens"),
            usage_int(usage, "completion_tokens"),
            reported if isinstance(reported, str) and reported else None,
        )

    def is_context_error(self, status: int, info: ErrorInfo) -> bool:
        if status == 413:
            return True
        if status not in (400, 422):
            return False
        return info.code in _CONTEXT_CODES or bool(_CONTEXT_MESSAGE.search(info.message))


def _finish_reason(choice: Any) -> str | None:
    reason = choice.get("finish_reason") if isinstance(choice, dict) else None
    return reason if isinstance(reason, str) and reason.isidentifier() else None
