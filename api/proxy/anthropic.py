"""The Anthropic Messages dialect (`POST /v1/messages`).

`system` and `messages` are converted losslessly to prefit's format
(shared/formats/anthropic.py) and the fitted prompt back; every other field rides along.
The prompt count is `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`,
found in a streamed answer's `message_start` event. The upstream is authenticated with
`x-api-key`, and the client's `anthropic-version` and `anthropic-beta` headers are passed on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from api.proxy.overflow import Overflow, anthropic_figures
from api.proxy.streaming import Tap, data_of
from api.proxy.upstream import ANTHROPIC
from shared.errors import InvalidTranscript
from shared.formats import from_anthropic, to_anthropic
from shared.formats.blocks import user_blocks
from shared.messages import Message, ToolSpec

API_VERSION = "2023-06-01"  # sent when the client names none
USAGE_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
ERROR_TYPES = {  # the error `type` Anthropic gives each status
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def prompt_of(usage: Any) -> int | None:
    """The whole prompt's tokens in an Anthropic `usage` object (cached parts included)."""
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    return sum(v for v in (usage.get(f) for f in USAGE_FIELDS) if isinstance(v, int))


def source_index(system: Any, given: list[Any], index: int | None) -> int | None:
    """The index of the Anthropic message that converted message `index` came from (each
    user turn of tool results becomes a tool message per result, then its other blocks)."""
    left = -1 if index is None else index - (system is not None)
    if left < 0:  # no index, or the system prompt's
        return None
    for i, m in enumerate(given):
        content = m["content"]
        if m["role"] == "assistant" or isinstance(content, str):
            left -= 1
        else:
            results, rest = user_blocks(content)
            left -= len(results) + (1 if rest or not results else 0)
        if left < 0:
            return i
    return None


class StartTap:
    """Reads the prompt count from `message_start`; keeps every event."""

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None

    def keep(self, event: bytes) -> bool:
        if self.prompt_tokens is None and b"message_start" in event:
            data = data_of(event)
            message = data.get("message") if isinstance(data, dict) else None
            if isinstance(message, dict):
                self.prompt_tokens = prompt_of(message.get("usage"))
        return True


class AnthropicDialect:
    """Anthropic Messages."""

    name = ANTHROPIC
    forwarded: tuple[str, ...] = ("anthropic-version", "anthropic-beta")

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        given = body.get("messages")
        if not isinstance(given, list):
            raise InvalidTranscript("'messages' must be a list")
        system = body.get("system")
        messages = from_anthropic(system, given)
        try:  # what converts may still break prefit's own rules (a call left unanswered)
            messages = check(messages)
        except InvalidTranscript as exc:
            at = source_index(system, given, exc.index)
            raise InvalidTranscript(exc.reason, at) from None
        tools = body.get("tools")
        return messages, list(tools) if isinstance(tools, list) else []

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        system, converted = to_anthropic(messages)
        out = {**body, "messages": converted}
        if system is None:
            out.pop("system", None)
        else:
            out["system"] = system
        return out

    def auth(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def defaults(self) -> dict[str, str]:
        return {"anthropic-version": API_VERSION}

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        return None, False  # message_start always carries the usage

    def tap(self, strip: bool) -> Tap:
        return StartTap()

    def prompt_tokens(self, answer: Any) -> int | None:
        return prompt_of(answer.get("usage")) if isinstance(answer, dict) else None

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        if status not in (400, 413):
            return None
        err = answer.get("error") if isinstance(answer, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        return anthropic_figures(message) if isinstance(message, str) else None

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
