"""Request size limits: body bytes while reading (413), then message counts and string sizes (422).

`BodyLimit` is a pure ASGI middleware. A declared `Content-Length` over the limit is refused
before a single body byte is read; a chunked or lying body is counted as it arrives and
refused as soon as the count passes the limit, so an oversize body is never buffered. The
app's own answer (it sees the body end early) is swallowed and replaced by the 413.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.requestlog import SCOPE_KEY, RequestLog
from shared.errors import TooLarge

PLACEHOLDER = "<...>"


class _BodyTooLarge(Exception):
    """Raised into the app from `receive` once the body passes the limit."""


class BodyLimit:
    """Answer 413 to any request body larger than `max_bytes`, without buffering it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            _note_refusal(scope)
            await _refuse(send, 413, self._message(f"declares {declared} bytes"))
            return
        state = {"received": 0, "over": False, "started": False}

        async def limited() -> Message:
            if state["over"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["over"] = True
                    raise _BodyTooLarge
            return message

        async def guarded(message: Message) -> None:
            if state["over"]:
                return  # the app's answer to a cut-off body: replaced by the 413
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        with contextlib.suppress(_BodyTooLarge):
            await self.app(scope, limited, guarded)
        if state["over"]:
            _note_refusal(scope)
        if state["over"] and not state["started"]:
            await _refuse(send, 413, self._message(f"sent more than {self.max_bytes} bytes"))

    def _message(self, what: str) -> dict[str, Any]:
        return {
            "type": TooLarge.__name__,
            "message": f"request body {what}; the limit is {self.max_bytes} bytes",
            "limit": self.max_bytes,
        }


def _note_refusal(scope: Scope) -> None:
    record = scope.get("state", {}).get(SCOPE_KEY)
    if isinstance(record, RequestLog):
        record.error = TooLarge.__name__


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects it; the count still applies
    return None


async def _refuse(send: Send, status: int, error: dict[str, Any]) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def check_sizes(
    fields: Iterable[tuple[str, Any]], *, max_messages: int, max_string_chars: int
) -> None:
    """`TooLarge` naming the first list of messages or string over its limit, or the first
    value nested deeper than `MAX_NESTING` (counting and copying recurse: a 500 otherwise).

    `fields` are `(name, value)` pairs of the request; `messages` is the one counted.
    """
    for name, value in fields:
        if name == "messages" and isinstance(value, list) and len(value) > max_messages:
            raise TooLarge(
                f"messages: {len(value)} messages exceed the limit of {max_messages} per request"
            )
        excess = _excess(name, value, max_string_chars)
        if excess is not None:
            raise TooLarge(excess)


MAX_NESTING = 100  # levels of arrays and objects in one field: real tool schemas use ~10


def _excess(name: str, value: Any, limit: int) -> str | None:
    """What is wrong with the first string (or key) longer than `limit`, or the first value
    nested deeper than `MAX_NESTING`; iterative."""
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            if len(item) > limit:
                return _long(path, len(item), limit)
        elif isinstance(item, dict | list) and depth >= MAX_NESTING:
            return f"{path}: nested deeper than {MAX_NESTING} levels of arrays and objects"
        elif isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                if len(k) > limit:
                    return _long(f"{path}.{PLACEHOLDER}", len(k), limit)
                stack.append((f"{path}.{k}", v, depth + 1))
        elif isinstance(item, list):
            pairs = reversed(list(enumerate(item)))
            stack.extend((f"{path}[{i}]", v, depth + 1) for i, v in pairs)
    return None


def _long(where: str, size: int, limit: int) -> str:
    return f"{where}: a string of {size} characters exceeds the limit of {limit} characters"
