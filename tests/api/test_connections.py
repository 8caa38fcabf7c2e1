"""Connections that do not finish a request are closed, on the API's own command line."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import serve_process


def _env(redis_url: str, **timeouts: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": redis_url, "PREFIT_API_KEYS": "alice:ka", **timeouts}


@pytest.fixture(scope="module")
def quick(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API's command line with 1 s header, body and idle timeouts."""
    timeouts = {
        "PREFIT_SERVER_HEADER_TIMEOUT_S": "1",
        "PREFIT_SERVER_BODY_TIMEOUT_S": "1",
        "PREFIT_SERVER_IDLE_TIMEOUT_S": "1",
    }
    log = tmp_path_factory.mktemp("api") / "api.log"
    with serve_process(_env(redis_url, **timeouts), log) as url:
        yield url


def _open(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.settimeout(10)
    return conn


def _closed_after(conn: socket.socket) -> float:
    """Seconds until the server closes `conn` (reading whatever it sends first)."""
    started = time.monotonic()
    while conn.recv(65536):
        pass
    return time.monotonic() - started


def test_a_connection_that_sends_nothing_or_half_its_headers_is_closed(quick: str) -> None:
    """Nothing, half the headers, and a header line every 0.4 s: each closed about 1 s in."""
    silent = _open(quick)
    half = _open(quick)
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    assert _closed_after(silent) < 3 and _closed_after(half) < 3
    trickle = _open(quick)
    trickle.sendall(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    assert _trickled_until_closed(trickle, lines=20)  # 8 s of headers, if nothing stopped it
    assert time.monotonic() - started < 3


def _trickled_until_closed(conn: socket.socket, lines: int) -> bool:
    """Send a header line every 0.4 s; True once the server has closed `conn`."""
    for k in range(lines):
        time.sleep(0.4)
        try:
            conn.sendall(b"X-%d: y\r\n" % k)
            if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                return True
        except BlockingIOError:  # open, nothing to read
            continue
        except OSError:  # reset or broken pipe: closed
            return True
    return False


def test_a_stalled_body_is_closed_and_a_finished_request_served(quick: str) -> None:
    """A body that stops arriving is cut off; a whole request on the same server is
    answered, and its keep-alive connection closed once idle."""
    stalled = _open(quick)
    stalled.sendall(
        b"POST /v1/prepare HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ka\r\n"
        b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model":'
    )
    assert _closed_after(stalled) < 3
    served = _open(quick)
    served.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert served.recv(65536).startswith(b"HTTP/1.1 200")
    assert _closed_after(served) < 3  # idle after its answer


@pytest.mark.slow
def test_half_sent_headers_are_closed_within_30_s_by_default(
    redis_url: str, tmp_path: Path
) -> None:
    """The defaults: a half-sent request is closed within 30 s (10 s)."""
    with serve_process(_env(redis_url), tmp_path / "api.log") as url:
        half = _open(url)
        half.settimeout(30)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        assert _closed_after(half) < 30
