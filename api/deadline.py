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

The deadline is for prefit's own work, never for the provider's: the proxy waits on the
provider inside `upstream_wait`, which pauses the clock (what was left of it is left when the
wait ends, so a retry's fit after an overflow is still bounded). That wait is bounded by the
upstream client's own timeouts instead (`PREFIT_UPSTREAM_*`: connect, read between two bytes,
write, pool; api/proxy/upstream.py), so a provider answering after minutes, or streaming with
long pauses, reaches the client whole. While paused the middleware watches the client: a
client that goes away then cancels the app's task, and with it the upstream call (once the
answer has started, Starlette's streaming response does the same). The explicit API never
waits on a provider, so its deadline is as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from contextvars import ContextVar
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


class Clock:
    """One request's deadline: when it passes, and whether it is paused or spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + seconds
        self.reading = False  # the app is waiting for the client's body
        self.started = False  # the answer has started: too late to replace it
        self.abandoned = False  # the deadline answered instead of the app
        self.changed = asyncio.Event()  # set when it is paused or resumed
        self._waits = 0  # upstream waits under way (`upstream_wait`)
        self._left = seconds  # what was left when the first of them began

    @property
    def waiting(self) -> bool:
        """Whether the app is waiting on the provider (the clock is paused)."""
        return self._waits > 0

    def remaining(self) -> float:
        return self._left if self.waiting else self.at - self._loop.time()

    def extend(self, seconds: float) -> None:
        """Give the request `seconds` more (a wait the client asked for)."""
        self.at += max(0.0, seconds)

    def restart(self) -> None:
        """A full deadline from now (the client's body just arrived)."""
        self.at = max(self.at, self._loop.time() + self.seconds)

    def pause(self) -> None:
        """Stop the clock: the app waits on the provider."""
        if not self._waits:
            self._left = self.remaining()
        self._waits += 1
        self.changed.set()

    def resume(self) -> None:
        """Run the clock again with what was left of it when it was paused."""
        self._waits -= 1
        if not self._waits:
            self.at = self._loop.time() + self._left
        self.changed.set()


_current: ContextVar[Clock | None] = ContextVar("prefit_deadline", default=None)


@contextlib.asynccontextmanager
async def upstream_wait() -> AsyncIterator[None]:
    """The request's deadline paused while the app waits on the provider (nothing to pause
    outside the middleware, e.g. in unit tests)."""
    clock = _current.get()
    if clock is None:
        yield
        return
    clock.pause()
    try:
        yield
    finally:
        clock.resume()


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
        _current.set(clock)  # for `upstream_wait` in the app's task, which copies it
        # the store's retries (a cluster failing over) stop in time for an answer: the app's
        # task and its threadpool calls inherit this
        retry_within(clock.remaining)
        client = _Client(receive, clock)
        task = asyncio.ensure_future(self.app(scope, client.receive, self._guarded(send, clock)))
        try:
            timed_out = await self._watch(task, clock, client)
        finally:
            client.close()
        if task.done():
            task.result()  # re-raise what the app raised (the request logger answers it)
            return
        task.cancel()
        task.add_done_callback(_forget)
        if not timed_out:  # the client went away while the provider was answering
            _note(scope, "ClientDisconnected")
            log.info("request.client_gone")
            return
        clock.abandoned = True
        _note(scope, "StoreUnavailable")
        await _answer_503(send, self.seconds)

    @staticmethod
    def _guarded(send: Send, clock: Clock) -> Send:
        async def guarded_send(message: Message) -> None:
            if clock.abandoned:
                return  # the deadline answered already
            if message["type"] == "http.response.start":
                clock.started = True
            await send(message)

        return guarded_send

    @staticmethod
    async def _watch(task: asyncio.Future[None], clock: Clock, client: _Client) -> bool:
        """Wait for `task`; True when the deadline passes first, False when the client goes
        away while the app waits on the provider (`task` is then left running)."""
        while not task.done():
            clock.changed.clear()
            if clock.started:
                await asyncio.wait({task})
                break
            timeout: float | None = None
            waits: set[asyncio.Future[Any]] = {task}
            if clock.waiting:
                if client.left():
                    return False
                gone = client.gone()
                if gone is not None and not gone.done():
                    waits.add(gone)
            elif not clock.reading:
                timeout = clock.remaining()
                if timeout <= 0:
                    return True
            changed = asyncio.ensure_future(clock.changed.wait())
            try:
                await asyncio.wait(
                    waits | {changed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()
        return False


class _Client:
    """The client's side of one request: its body as the app reads it (the clock stopped
    meanwhile), then one shared read of what comes after it, the disconnect."""

    def __init__(self, receive: Receive, clock: Clock) -> None:
        self._receive = receive
        self._clock = clock
        self._body_done = False
        self._after: asyncio.Future[Message] | None = None

    async def receive(self) -> Message:
        if self._body_done:  # every later read shares the one after the body
            return await asyncio.shield(self._listen())
        self._clock.reading = True
        self._clock.changed.set()
        try:
            message = await self._receive()
        finally:
            self._clock.reading = False
            self._clock.restart()
            self._clock.changed.set()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
        return message

    def gone(self) -> asyncio.Future[Message] | None:
        """The client's next message once its body was read (its disconnect: nothing else
        comes after a body), None before."""
        return self._listen() if self._body_done else None

    def left(self) -> bool:
        """Whether the client has gone away (its disconnect came after its body)."""
        after = self._after
        if after is None or not after.done() or after.cancelled() or after.exception():
            return False
        return bool(after.result()["type"] == "http.disconnect")

    def _listen(self) -> asyncio.Future[Message]:
        if self._after is None:
            self._after = asyncio.ensure_future(self._receive())
        return self._after

    def close(self) -> None:
        if self._after is not None and not self._after.done():
            self._after.cancel()
        if self._after is not None:
            self._after.add_done_callback(_forget)


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


def _note(scope: Scope, error: str) -> None:
    record = scope.get("state", {}).get(SCOPE_KEY)
    if isinstance(record, RequestLog):
        record.error = error


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
