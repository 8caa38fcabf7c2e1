"""Streamed answers, passed through event by event as they arrive.

The upstream's server-sent events are cut at their blank-line boundaries and each complete
event goes on to the client as soon as it is in, unchanged; nothing waits for the end. A
`Tap` sees every event on the way: it reads the provider's usage and may drop the one event
prefit itself asked for (OpenAI's usage chunk when the client did not want it). A client
that goes away cancels the generator, which closes the upstream response at once, so the
provider stops generating. A provider that breaks off mid-stream ends the client's stream
with an `error` event (`broken`), which both SDKs raise, so a cut answer is never taken for
a whole one.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import anyio
import httpx

from api.requestlog import RequestLog
from shared.logs import get_logger

log = get_logger(__name__)

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class Tap(Protocol):
    """Watches a stream's events: keeps the provider's prompt count, filters events."""

    prompt_tokens: int | None

    def keep(self, event: bytes) -> bool:
        """Whether `event` (one complete event, terminator included) goes to the client."""
        ...


class Events:
    """Complete server-sent events out of a byte stream cut anywhere."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completes, each with its terminating blank line."""
        buf = self._rest + chunk
        out: list[bytes] = []
        start = 0
        for m in _BOUNDARY.finditer(buf):
            out.append(buf[start : m.end()])
            start = m.end()
        self._rest = buf[start:]
        return out

    def rest(self) -> bytes:
        """What followed the last complete event."""
        return self._rest


def data_of(event: bytes) -> Any:
    """The JSON of an event's `data:` lines, or None when it has none or it is not JSON."""
    lines = [
        line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:")
    ]
    if not lines:
        return None
    try:
        return json.loads(b"\n".join(lines))
    except ValueError:
        return None


def error_event(body: Any) -> bytes:
    """An SSE `error` event carrying `body` (an error body of the stream's protocol)."""
    return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"


class OpenedStream:
    """A stream whose first events may be read before any is passed on (to see an error the
    provider reports in the stream before its output), then the rest as it comes."""

    def __init__(self, response: httpx.Response) -> None:
        self.chunks = response.aiter_bytes()
        self.events = Events()
        self.read: list[bytes] = []  # the events read ahead, not yet passed on
        self.broke: httpx.TransportError | None = None

    async def until(self, done: Callable[[bytes], bool]) -> bytes | None:
        """Read ahead to the first event `done` accepts, and return it (None at the end)."""
        try:
            async for chunk in self.chunks:
                events = self.events.feed(chunk)
                self.read += events
                found = next((e for e in events if done(e)), None)
                if found is not None:
                    return found
        except httpx.TransportError as exc:  # passed on as a break, after what was read
            self.broke = exc
        return None


async def passthrough(
    response: httpx.Response,
    tap: Tap,
    rec: RequestLog,
    broken: bytes,
    opened: OpenedStream,
) -> AsyncIterator[bytes]:
    """The upstream's events, as they arrive (after those `opened` read ahead), less those
    `tap` drops; `broken` if the upstream breaks off."""
    events = opened.events
    try:
        kept = [e for e in opened.read if tap.keep(e)]
        if kept:
            yield b"".join(kept)
        if opened.broke is not None:
            raise opened.broke
        async for chunk in opened.chunks:
            kept = [e for e in events.feed(chunk) if tap.keep(e)]
            if kept:
                yield b"".join(kept)
        if events.rest():
            yield events.rest()  # an unterminated last event, as the provider sent it
    except httpx.TransportError as exc:  # the client's stream ends where the provider's did
        rec.error = "UpstreamBroke"
        log.warning("proxy.upstream_broke", error=type(exc).__name__)
        yield broken  # a partial last event was never sent: this one stands alone
    except (asyncio.CancelledError, GeneratorExit):
        rec.error = "ClientDisconnected"
        raise
    finally:
        with anyio.CancelScope(shield=True):  # cancelled or not, the provider must hear it
            await response.aclose()
