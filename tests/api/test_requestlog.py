"""The request log: a client that leaves mid-upload is a 499 at info level, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from fastapi import FastAPI

from api.app import create_app
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of


async def _left_mid_upload(app: FastAPI, path: str, key: str) -> list[dict[str, Any]]:
    """POST `path` declaring 1 MB, send 10 kB of it, then disconnect; what the app sent."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1048576"),
                    (b"authorization", f"Bearer {key}".encode())],
    }  # fmt: skip
    parts = [{"type": "http.request", "body": b'{"model": "m", "messages": [' + b" " * 10_000,
              "more_body": True}, {"type": "http.disconnect"}]  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return parts.pop(0) if parts else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", ["/v1/prepare", "/v1/conversations/c/messages", "/v1/chat/completions", "/v1/messages"]
)
async def test_a_client_leaving_mid_upload_is_a_499_at_info(
    settings: Settings, store: Store, tenant: str, path: str
) -> None:
    """Explicit API and proxy alike: `request.completed` says 499 ClientDisconnected at info
    level, the metrics count no 5xx, and no crash is logged."""
    app = create_app(settings, store=store, enqueue=Recorder())
    with structlog.testing.capture_logs() as logs:
        await _left_mid_upload(app, path, key_of(tenant))
    done = [e for e in logs if e["event"] == "request.completed"]
    assert [(e["status"], e["log_level"], e["error"]) for e in done] == [
        (499, "info", "ClientDisconnected")
    ], logs
    assert not [e for e in logs if e["event"] == "request.crashed"]
