"""Connections that do not finish a request are closed: uvicorn's protocol with deadlines.

uvicorn closes a keep-alive connection idle between requests (`--timeout-keep-alive`), but
has no deadline for a request's headers or body: a connection that sends nothing, half its
headers, or a header line every few seconds (slowloris) holds a socket and a file
descriptor for as long as the client likes. `GuardedHttpTools` is uvicorn's httptools
protocol (the one `auto` picks, httptools being a dependency) with its timers set:

- headers: from the connection's start, or the end of its last answer, a request's headers
  are complete within `PREFIT_SERVER_HEADER_TIMEOUT_S`, however they trickle in, or the
  connection is closed (nginx's `client_header_timeout`);
- idle: a keep-alive connection with no request for `PREFIT_SERVER_IDLE_TIMEOUT_S` (uvicorn's
  own timer, set from the settings here; nginx's `keepalive_timeout`);
- body: between two reads of a request's body at most `PREFIT_SERVER_BODY_TIMEOUT_S`, or the
  connection is closed and the app sees the client gone (a 499 in the request log, as nginx's
  `client_body_timeout`). Not counted while prefit itself holds reading back (flow control:
  the app has not taken what came).

Chosen over hypercorn or granian, which have such timeouts: uvicorn is what the API is
tested and measured under, and the subclass is forty lines of its own protocol.
`prefit up` passes it as `--http api.connections:GuardedHttpTools`.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.logs import get_logger
from shared.settings import get_settings

log = get_logger(__name__)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a body read timeout."""

    header_timeout_s: ClassVar[float | None] = None  # None: the settings'
    body_timeout_s: ClassVar[float | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self._header_s = self.header_timeout_s or settings.server_header_timeout_s
        self._body_s = self.body_timeout_s or settings.server_body_timeout_s
        self.timeout_keep_alive = settings.server_idle_timeout_s  # uvicorn's own idle timer
        self._headers_due: asyncio.TimerHandle | None = None
        self._body_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._cancel()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            self._await_body()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._await_body()

    def on_message_complete(self) -> None:
        self._cancel()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # its headers are in: it starts now
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._await_headers()  # the next request's, however long the keep-alive

    def _await_headers(self) -> None:
        self._cancel()
        self._headers_due = self.loop.call_later(self._header_s, self._close, "headers")

    def _await_body(self) -> None:
        self._cancel()
        self._body_due = self.loop.call_later(self._body_s, self._body_idle)

    def _body_idle(self) -> None:
        if self.flow.read_paused:  # prefit is not reading: the client is not late
            self._await_body()
            return
        self._close("body")

    def _close(self, what: str) -> None:
        if not self.transport.is_closing():
            log.info("connection.timed_out", waiting_for=what)
            self.transport.close()

    def _cancel(self) -> None:
        for timer in (self._headers_due, self._body_due):
            if timer is not None:
                timer.cancel()
        self._headers_due = self._body_due = None
