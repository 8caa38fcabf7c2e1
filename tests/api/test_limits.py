"""Size limits: 413 for body bytes before buffering, 422 for message counts and string sizes."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from api.app import create_app
from api.limits import BodyLimit, check_sizes
from shared.errors import TooLarge
from shared.store import Store
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.helpers import body, conv_id
from tests.api.server import serve
from tests.builders import chat, user

pytestmark = pytest.mark.anyio

LIMIT = 10_000


def test_check_sizes_counts_messages() -> None:
    """More messages than allowed is TooLarge, saying how many and the limit."""
    with pytest.raises(TooLarge, match="messages: 4 messages exceed the limit of 3"):
        check_sizes([("messages", [{}] * 4)], max_messages=3, max_string_chars=100)


def test_check_sizes_names_the_long_string() -> None:
    """The first over-long string is named by its path and size."""
    value = [{"role": "user", "content": [{"type": "text", "text": "x" * 101}]}]
    with pytest.raises(TooLarge, match=r"messages\[0\].content\[0\].text: a string of 101"):
        check_sizes([("messages", value)], max_messages=3, max_string_chars=100)
    check_sizes([("messages", value)], max_messages=3, max_string_chars=101)


def test_counts_and_strings_over_limits_are_422_and_store_nothing(
    redis_url: str, store: Store, recorder: Recorder, tenant: str, model: str
) -> None:
    """Over-limit requests get a precise 422 and leave nothing stored."""
    settings = make_settings(
        redis_url,
        model,
        api_keys=f"{tenant}:{key_of(tenant)}",
        max_messages=3,
        max_string_chars=100,
    )
    app = create_app(settings, store=store, enqueue=recorder)
    cid = conv_id()
    with TestClient(app, headers={"Authorization": f"Bearer {key_of(tenant)}"}) as c:
        r = c.post(f"/v1/conversations/{cid}/messages", json=body(chat(2), model))
        assert r.status_code == 422 and r.json()["error"]["type"] == "TooLarge"
        assert "5 messages exceed the limit of 3" in r.json()["error"]["message"]
        r = c.post(f"/v1/conversations/{cid}/messages", json=body([user("y" * 200)], model))
        assert r.status_code == 422 and "messages[0].content" in r.json()["error"]["message"]
        assert c.get(f"/v1/conversations/{cid}").status_code == 404


async def _reader(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that buffers the whole body, as any JSON route does."""
    data = await Request(scope, receive).body()
    await JSONResponse({"bytes": len(data)})(scope, receive, send)


async def _run(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: int, path: str = "/"
) -> tuple[list[Message], int]:
    """Drive `app` with a body of `chunks` 1 KB chunks; return what it sent and receive calls."""
    sent: list[Message] = []
    calls = 0

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": calls < chunks}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return sent, calls


async def test_declared_oversize_body_is_refused_before_any_read() -> None:
    """A Content-Length over the limit is answered 413 without reading a byte."""
    sent, calls = await _run(
        BodyLimit(_reader, LIMIT), [(b"content-length", b"10000000000")], 10**7
    )
    assert calls == 0
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["type"] == "TooLarge"


async def test_streamed_oversize_body_stops_being_read_at_the_limit() -> None:
    """A chunked body is counted as it arrives and refused once past the limit."""
    sent, calls = await _run(BodyLimit(_reader, LIMIT), [], 10**7)
    assert calls == LIMIT // 1000 + 1  # the chunk that crossed the limit was the last read
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]


async def test_body_under_the_limit_passes() -> None:
    """Bodies within the limit reach the app whole."""
    sent, _calls = await _run(BodyLimit(_reader, LIMIT), [], 5)
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"bytes": 5000}


async def test_the_real_app_refuses_streamed_oversize_bodies(
    redis_url: str, store: Store, recorder: Recorder, model: str
) -> None:
    """Through FastAPI's own body parsing, the answer is still a single 413."""
    app = create_app(
        make_settings(redis_url, model, max_body_bytes=LIMIT), store=store, enqueue=recorder
    )
    headers = [(b"content-type", b"application/json")]
    sent, calls = await _run(app, headers, 10**7, path="/v1/prepare")
    assert calls == LIMIT // 1000 + 1
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]


def test_uvicorn_answers_413_before_the_chunked_body_ends(
    redis_url: str, store: Store, recorder: Recorder, model: str
) -> None:
    """Over real HTTP: a never-ending chunked upload gets its 413 once past the limit."""
    settings = make_settings(redis_url, model, max_body_bytes=LIMIT)
    with serve(create_app(settings, store=store, enqueue=recorder)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            chunk = b"%x\r\n%s\r\n" % (1000, b"x" * 1000)
            # Just past the limit, and no terminating chunk: the body never ends. (Sending
            # more than the server reads would make its close a reset, losing the answer.)
            sock.sendall(
                b"POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunk * (LIMIT // 1000 + 1)
            )
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 413")
        assert b'"TooLarge"' in answer

        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
            )
            assert _read_all(sock).startswith(b"HTTP/1.1 413")


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data
