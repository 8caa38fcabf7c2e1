"""One canonical JSON log line per request: what happened, never what was said.

A pure ASGI middleware puts a `RequestLog` in the request's scope; handlers fill in the
tenant, conversation id, strategies and summary outcome; when the response is done the
middleware writes `request.completed` with the route template, status and latency, and
hands the record to an observer (the metrics). Message text and keys never get here.

A client that goes away before its request is read whole (`ClientDisconnect` out of a body
read) is no fault of the service: logged at info as status 499 (nginx's "client closed
request"), with nothing sent, since nobody is listening.

It is also the catch-all for bugs: an unexpected exception is logged as `request.crashed`
with its type and stack frames but not its message (messages can quote content), answered
500, and not re-raised, so the server does not log it again with the message.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.logs import get_logger

log = get_logger("api.request")

SCOPE_KEY = "prefit_log"
CLIENT_CLOSED = 499  # the client left before its request was read (nginx's status for it)
DISCONNECTED = "ClientDisconnected"


@dataclass
class RequestLog:
    """What one request did; every field is an id, a count or a flag."""

    method: str = ""
    route: str = ""
    status: int = 0
    latency_ms: float = 0.0
    tenant: str | None = None
    conversation_id: str | None = None
    strategies: list[str] = field(default_factory=list)
    summary_hit: bool | None = None
    stale: bool | None = None
    degraded: bool | None = None
    enqueued: str | None = None
    waited_ms: float | None = None
    length: int | None = None
    error: str | None = None
    # the drop-in proxy's routes (api/proxy)
    fit: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    retries: int | None = None
    upstream_status: int | None = None
    upstream_ms: float | None = None  # waiting for the provider's answers to start, all tries

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != []}


def request_log(request: Request) -> RequestLog:
    """The request's log record (a detached one outside the middleware, e.g. in unit tests)."""
    state = request.scope.setdefault("state", {})
    found = state.get(SCOPE_KEY)
    if not isinstance(found, RequestLog):
        found = RequestLog()
        state[SCOPE_KEY] = found
    return found


class RequestLogger:
    """Time each HTTP request, log it once, and pass the record to `observe`."""

    def __init__(self, app: ASGIApp, observe: Callable[[RequestLog], None] | None = None) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestLog(method=scope.get("method", ""))
        scope.setdefault("state", {})[SCOPE_KEY] = record
        started = time.perf_counter()

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                # the answer is out: background work (a summary enqueue) is not its latency
                record.latency_ms = round((time.perf_counter() - started) * 1000, 3)

        try:
            await self.app(scope, receive, capture)
        except ClientDisconnect:
            record.status = record.status or CLIENT_CLOSED
            record.error = DISCONNECTED
        except Exception as exc:  # a bug: answered here, so no server logs its message
            record.error = "InternalError"
            log.error("request.crashed", error=type(exc).__name__, frames=_frames(exc))
            if record.status:
                raise  # the answer had started: only closing the connection is left
            await _crashed(capture)
        finally:
            if not record.latency_ms:
                record.latency_ms = round((time.perf_counter() - started) * 1000, 3)
            route = scope.get("route")
            record.route = getattr(route, "path", None) or "<unmatched>"
            self._emit(record)

    def _emit(self, record: RequestLog) -> None:
        fields = record.fields()
        if record.status >= 500:
            log.error("request.completed", **fields)
        else:
            log.info("request.completed", **fields)
        if self.observe is not None:
            self.observe(record)


async def _crashed(send: Send) -> None:
    body = json.dumps({"error": {"type": "PrefitError", "message": "internal error (logged)"}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


def _frames(exc: BaseException) -> list[str]:
    """Where the exception went, frame by frame, without its message (it may quote content)."""
    return [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)]
