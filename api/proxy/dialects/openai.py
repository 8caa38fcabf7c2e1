"""The OpenAI Chat Completions dialect (`POST /v1/chat/completions`).

The body's `messages` are already in prefit's format. A streamed request that did not ask
for usage gets `stream_options.include_usage` upstream, so the prompt count can be
observed, and the usage chunk that this adds (the one with no choices) is dropped before it
reaches the client. The other chunks then carry `"usage": null`, which clients accept.

The upstream is `PREFIT_OPENAI_BASE_URL` (ending in /v1) with `PREFIT_OPENAI_API_KEY`; an
overflow is a 400 (or 413) whose code is `context_length_exceeded` or whose message says
so, its figures read from each wording OpenAI and compatible servers use (`openai_figures`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from api.proxy.dialects import Asked, asked_in_body, error_fields, tools_of
from api.proxy.dialects.anthropic import anthropic_figures
from api.proxy.overflow import NUMBER, Overflow, number
from api.proxy.streaming import Tap, data_of
from api.proxy.upstream import Upstream, secret
from shared.errors import InvalidTranscript
from shared.messages import Message, ToolSpec
from shared.settings import Settings

OPENAI = "openai"

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
# what an overflow's message says when its `code` is not `context_length_exceeded` (older
# or compatible servers, proxies that drop the code)
_CONTEXT = re.compile(
    r"maximum context length|context[_ ]length|exceeds? the (?:context|available context)"
    r"|exceed the configured limit|prompt is too long|exceed context limit|context size",
    re.I,
)
_ERROR_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    413: "request_too_large",
    429: "rate_limit_exceeded",
}
# "This model's maximum context length is 128000 tokens. However, your messages resulted in
# 130000 tokens" / "... you requested 131000 tokens (130000 in the messages, 1000 in the
# completion)"; newer models: "Input tokens exceed the configured limit of 272000 tokens.
# Your messages resulted in 300000 tokens."; compatible servers (Mistral): "Prompt contains
# 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length"
_LIMIT = re.compile(
    rf"(?:maximum context length is|limit of) {NUMBER}|{NUMBER} maximum context length"
)
_PROMPT = re.compile(
    rf"(?:resulted in {NUMBER} tokens|\({NUMBER} in the messages"
    rf"|[Pp]rompt contains {NUMBER} tokens)"
)
_OUTPUT = re.compile(rf"{NUMBER} in the completion")


def openai_figures(message: str) -> Overflow:
    """The figures of an OpenAI `context_length_exceeded` message (or of an Anthropic
    wording, which Anthropic-backed OpenAI-compatible endpoints pass on)."""
    limit = _LIMIT.search(message)
    prompt = _PROMPT.search(message)
    output = _OUTPUT.search(message)
    if limit is None and prompt is None:
        return anthropic_figures(message) or Overflow()
    return Overflow(
        prompt_tokens=number(_first(prompt)),
        limit=number(_first(limit)),
        output=number(output.group(1)) if output else None,
    )


def _first(found: re.Match[str] | None) -> str | None:
    """The first group a match filled (None without a match)."""
    return next((g for g in found.groups() if g), None) if found else None


class UsageTap:
    """Reads `usage.prompt_tokens` from the usage chunk; drops it when prefit asked for it."""

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.prompt_tokens: int | None = None

    def keep(self, event: bytes) -> bool:
        if _USAGE.search(event) is None:
            return True
        data = data_of(event)
        if not isinstance(data, dict):
            return True
        usage = data.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        return not (self.strip and data.get("choices") == [])


class OpenAIDialect:
    """OpenAI Chat Completions."""

    name = OPENAI
    forwarded: tuple[str, ...] = ()

    def __init__(self, settings: Settings) -> None:
        root = settings.openai_base_url.rstrip("/")
        self.upstream = Upstream(OPENAI, root, secret(settings.openai_api_key))

    def asked(self, path: str, query: str, body: Mapping[str, Any]) -> Asked:
        return asked_in_body(path, body)

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidTranscript("'messages' must be a list")
        specs = tools_of(body)
        functions = body.get("functions")  # the legacy parameter: its specs take room too
        if isinstance(functions, list):
            specs += [{"type": "function", "function": f} for f in functions]
        return check(messages), specs

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        return {**body, "messages": messages}

    def auth(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def defaults(self) -> dict[str, str]:
        return {}

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            return None, False
        extra = options if isinstance(options, dict) else {}
        return {**body, "stream_options": {**extra, "include_usage": True}}, True

    def tap(self, strip: bool) -> Tap:
        return UsageTap(strip)

    def prompt_tokens(self, answer: Any) -> int | None:
        usage = answer.get("usage") if isinstance(answer, dict) else None
        found = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return found if isinstance(found, int) else None

    def counted(self, answer: Any) -> int | None:
        return None  # Chat Completions has no count-tokens endpoint

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        if status not in (400, 413):
            return None
        code, message = error_fields(answer)
        if code != "context_length_exceeded" and not _CONTEXT.search(message):
            return None
        return openai_figures(message)

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "api_error"
        kind = "requests" if status == 429 else kind  # OpenAI's rate limits
        return {"error": {"message": message, "type": kind, "code": _ERROR_CODES.get(status)}}
