"""Request and response bodies in either wire format, and validation of appended turns.

prefit works in OpenAI chat format; `"format": "anthropic"` requests (top-level `system`,
content blocks, `tool_use`/`tool_result`) are converted losslessly by shared/formats/anthropic.py on
the way in and back on the way out. Error indices name the messages as the client sent them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.cache import Loaded
from api.codec import dumps
from shared.errors import InvalidTranscript
from shared.formats import from_anthropic, to_anthropic, tools_from_anthropic
from shared.messages import Message, ToolSpec, validate


def incoming(
    messages: list[dict[str, Any]],
    *,
    format: str,
    system: Any,
    previous: Message | None = None,
) -> list[Message]:
    """The request's messages in OpenAI format (`previous`: the stored message they follow)."""
    if format == "anthropic":
        return from_anthropic(system, messages, previous=previous)
    if system is not None:
        raise InvalidTranscript("'system' is only accepted with format 'anthropic'")
    return messages


def incoming_tools(tools: list[dict[str, Any]] | None, *, format: str) -> list[ToolSpec]:
    """The request's tool specs in OpenAI format."""
    if not tools:
        return []
    return tools_from_anthropic(tools) if format == "anthropic" else tools


def validate_appended(context: Sequence[Message], new: Sequence[Message], *, format: str) -> None:
    """Validate `new` as it will follow `context` (the last stored turn group).

    A tool result must answer the assistant message before it, which may be stored already.
    """
    try:
        validate([*context, *new])
    except InvalidTranscript as exc:
        # with nothing stored the fault is the request's own (an empty first append)
        if context and (exc.index is None or exc.index < len(context)):
            raise InvalidTranscript(
                f"does not continue the stored conversation: {exc.reason}"
            ) from None
        shifted = exc.index - len(context) if exc.index is not None else None
        index = shifted if format == "openai" else None
        raise InvalidTranscript(exc.reason, index) from None


def prepared_body(
    messages: Sequence[Message],
    tokens: int,
    report: dict[str, Any],
    *,
    format: str,
    loaded: Loaded | None = None,
) -> bytes:
    """The JSON answer of a prepare; stored messages are emitted as their stored bytes.

    `InvalidTranscript` when a message holds text UTF-8 cannot encode (a lone surrogate, as a
    JSON `\\ud800` escape gives): the store refuses to write it, and no provider takes it.
    """
    try:
        return _prepared_body(messages, tokens, report, format=format, loaded=loaded)
    except UnicodeEncodeError as exc:
        raise InvalidTranscript(f"a message is not valid UTF-8: {exc.reason}") from None


def _prepared_body(
    messages: Sequence[Message],
    tokens: int,
    report: dict[str, Any],
    *,
    format: str,
    loaded: Loaded | None,
) -> bytes:
    if format == "anthropic":
        system, converted = to_anthropic(messages)
        return dumps({"messages": converted, "system": system, "tokens": tokens, "report": report})
    tail = dumps({"tokens": tokens, "report": report})
    if loaded is None:
        return b'{"messages":' + dumps(list(messages)) + b"," + tail[1:]
    # one join, so the answer (~200 KB at 128k tokens) is copied once: [m0, ",", m1, ...]
    pieces = [b","] * (2 * len(messages) + 1)
    pieces[0] = b'{"messages":['
    pieces[1::2] = loaded.encoded(messages)
    pieces.append(b"]," + tail[1:])
    if messages:
        pieces[-2] = b""  # no comma after the last message
    return b"".join(pieces)
