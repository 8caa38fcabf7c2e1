"""Every request is answered within the request deadline, whatever Redis does.

Redis calls have their own timeouts (sized to the deadline by `api.deps`), but a frozen Redis,
a handler making several calls in a row, or a full threadpool could still hold a request far
longer. `RequestDeadline` is a pure ASGI middleware that runs the app as a task and, if no
answer has started when the deadline passes, answers `503 StoreUnavailable` with
`Retry-After` itself; the late task is cancelled and anything it still sends is dropped.
(Work in a thread cannot be interrupted: it ends at its own Redis timeout, unseen.)

The clock stops while the app waits for the client's body (a slow upload is not Redis being
slow), and a handler may extend it for a wait the client asked for (`prepare`'s `wait_ms`).
`within` gives a handler's own step a shorter limit, for answering degraded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import RETRY_AFTER_S
from api.requestlog import SCOPE_KEY, RequestLog
from shared.logs import get_logger
from shared.store.client import retry_within

log = get_logger(__name__)

T = TypeVar("T")
STATE_KEY = "prefit_deadline"
POLL_S = 0.05  # how often a deadline paused for the client's body is looked at again


class Clock:
    """One request's deadline: when it passes, and whether it is paused or spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + seconds
        self.reading = False  # the app is waiting for the client's body
        self.started = False  # the answer has started: too late to replace it
        self.abandoned = False  # the deadline answered instead of the app

    def remaining(self) -> float:
        return self.at - self._loop.time()

    def extend(self, seconds: float) -> None:
        """Give the request `seconds` more (a wait the client asked for)."""
        self.at += max(0.0, seconds)

    def restart(self) -> None:
        """A full deadline from now (the client's body just arrived)."""
        self.at = max(self.at, self._loop.time() + self.seconds)


def clock_of(request: Request) -> Clock | None:
    """The request's deadline (None outside the middleware, e.g. in unit tests)."""
    found = request.scope.get("state", {}).get(STATE_KEY)
    return found if isinstance(found, Clock) else None


class RequestDeadline:
    """Answer 503 `StoreUnavailable` to any request the app has not answered in `seconds`."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        clock = Clock(self.seconds)
        scope.setdefault("state", {})[STATE_KEY] = clock
        # the store's retries (a cluster failing over) stop in time for an answer: the app's
        # task and its threadpool calls inherit this
        retry_within(clock.remaining)

        async def timed_receive() -> Message:
            clock.reading = True
            try:
                return await receive()
            finally:
                clock.reading = False
                clock.restart()

        async def guarded_send(message: Message) -> None:
            if clock.abandoned:
                return  # the deadline answered already
            if message["type"] == "http.response.start":
                clock.started = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, timed_receive, guarded_send))
        while not task.done():
            remaining = clock.remaining()
            if remaining <= 0 and not clock.reading and not clock.started:
                break
            wait = remaining if remaining > 0 and not clock.started else None
            await asyncio.wait({task}, timeout=POLL_S if clock.reading else wait)
        if task.done():
            task.result()  # re-raise what the app raised (the request logger answers it)
            return
        clock.abandoned = True
        task.cancel()
        task.add_done_callback(_forget)
        _note(scope)
        await _answer_503(send, self.seconds)


async def within(step: Awaitable[T], seconds: float) -> T:
    """`step`'s result if it comes within `seconds`, else `TimeoutError` at once.

    Unlike `asyncio.wait_for` it does not wait for a cancelled step to finish, which work
    handed to a thread never does before its own timeout.
    """
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=max(0.0, seconds))
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_forget)
    raise TimeoutError(f"no result within {seconds:.2f} s")


def _forget(task: asyncio.Future[Any]) -> None:
    """Collect a late task's outcome so nothing is reported as never retrieved."""
    with contextlib.suppress(asyncio.CancelledError):
        exc = task.exception()
        if exc is not None:
            log.info("request.late_step_failed", error=type(exc).__name__)


def _note(scope: Scope) -> None:
    record = scope.get("state", {}).get(SCOPE_KEY)
    if isinstance(record, RequestLog):
        record.error = "StoreUnavailable"


async def _answer_503(send: Send, seconds: float) -> None:
    error = {
        "type": "StoreUnavailable",
        "outcome": "unknown",  # the late work may still land: clients retry idempotent calls only
        "message": f"no answer within the {seconds:g} s request deadline (Redis slow or "
        "unreachable, or a request too large for PREFIT_REQUEST_DEADLINE_S); a write may or "
        "may not have landed: retry (appends with expected_length)",
    }
    body = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
