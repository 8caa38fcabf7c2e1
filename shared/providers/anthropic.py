"""Anthropic's Messages API.

`base_url` is the host root, e.g. `https://api.anthropic.com` (one ending in `/v1` is
accepted too); requests go to `{root}/v1/messages`. OpenAI-format input is mapped onto
it: system/developer messages become the top-level `system`, tool results become user
turns and tool calls are written out as text (the summarizer sends no tool specs), and
consecutive turns of one role are merged, as the API wants them to alternate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from shared.errors import InvalidTranscript, LLMError
from shared.messages import HEAD_ROLES, Message, text_of
from shared.providers.base import ErrorInfo, ProviderClient, usage_int

API_VERSION = "2023-06-01"
# "prompt is too long: 208000 tokens > 200000 maximum",
# "input length and `max_tokens` exceed context limit: ..."
_CONTEXT_MESSAGE = re.compile(
    r"prompt is too long|exceed context limit|context (?:window|length)", re.I
)


class AnthropicClient(ProviderClient):
    """`LLMClient` for the Anthropic Messages protocol."""

    protocol: ClassVar[str] = "anthropic"

    @staticmethod
    def root_of(base_url: str) -> str:
        return base_url.rstrip("/").removesuffix("/v1")

    def build_request(
        self, messages: Sequence[Message], model: str, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {"anthropic-version": API_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        system, turns = plain_turns(messages)
        payload: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": turns}
        if system:
            payload["system"] = system
        return "/v1/messages", headers, payload

    def parse(self, body: dict[str, Any]) -> tuple[str, int, int, str | None]:
        blocks = body.get("content")
        if not isinstance(blocks, list):
            raise LLMError("anthropic: answer has no content list", status=200)
        text = "".join(
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        if not text.strip():
            reason = body.get("stop_reason")
            shown = reason if isinstance(reason, str) and reason.isidentifier() else None
            raise LLMError(f"anthropic: empty completion (stop_reason={shown})", status=200)
        usage = body.get("usage")
        # cached prompt tokens are reported apart; all of them were read
        input_tokens = sum(
            usage_int(usage, k)
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        reported = body.get("model")
        return (
            text,
            input_tokens,
            usage_int(usage, "output_tokens"),
            reported if isinstance(reported, str) and reported else None,
        )

    def is_context_error(self, status: int, info: ErrorInfo) -> bool:
        if status == 413:
            return True
        return status == 400 and bool(_CONTEXT_MESSAGE.search(info.message))


def plain_turns(messages: Sequence[Message]) -> tuple[str, list[dict[str, str]]]:
    """(system text, alternating user/assistant turns) for OpenAI-format `messages`."""
    system: list[str] = []
    turns: list[dict[str, str]] = []
    for m in messages:
        role, text = m.get("role"), _text(m)
        if not text:
            continue
        if role in HEAD_ROLES:
            system.append(text)
            continue
        role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + text
        else:
            turns.append({"role": role, "content": text})
    if not turns:
        raise InvalidTranscript("anthropic: no user or assistant message with text to send")
    return "\n\n".join(system), turns


def _text(m: Message) -> str:
    text = text_of(m)
    if m.get("role") == "tool":
        return f"[tool result]\n{text}" if text else "[tool result: empty]"
    calls = m.get("tool_calls") or []
    rendered = [_call(c) for c in calls if isinstance(c, dict)]
    return "\n".join([text, *rendered] if text else rendered)


def _call(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"[tool call] {fn.get('name', '?')}({args})"
