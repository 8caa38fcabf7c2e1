"""`HEAD` answered as `GET` is, without the body (RFC 9110, 9.3.2).

Agents probe the service before they use it (Claude Code sends `HEAD /`); FastAPI routes a
`GET` route for `GET` only, so they got a 405. `HeadAsGet` is a pure ASGI middleware: a
`HEAD` request goes to the app as a `GET`, so every route answers it with the status and
headers (`content-length` included) that `GET` gets, and the body is dropped on the way
out. A proxied `GET` (`/v1/models`) is sent upstream as a `GET` too, since the headers
describe that answer.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Serve `HEAD` as `GET`, sending the `GET` answer's status and headers only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
