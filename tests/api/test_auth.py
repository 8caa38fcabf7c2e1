"""Bearer keys: the tenant comes from the key only, and tenants never see each other's data."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import structlog
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app, requires_loopback
from api.auth import LOCAL_TENANT, KeyRing
from shared.errors import ConfigError, Unauthorized
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.helpers import body, conv_id
from tests.builders import chat


def test_keyring_maps_keys_to_tenants_and_keeps_only_digests() -> None:
    """Each key names its tenant; the ring holds SHA-256 digests, not the keys."""
    ring = KeyRing.parse("acme:k-one, beta:k-two")
    assert ring.tenant_for("Bearer k-one") == "acme"
    assert ring.tenant_for("bearer  k-two") == "beta"
    assert "k-one" not in repr(ring) and all(len(d) == 32 for d, _ in ring.entries)
    assert ring.tenants == ["acme", "beta"] and not ring.open


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic k-one", "Bearer wrong", "k-one"])
def test_keyring_refuses_anything_but_a_known_bearer_key(header: str | None) -> None:
    """Missing, malformed or unknown keys are Unauthorized."""
    with pytest.raises(Unauthorized):
        KeyRing.parse("acme:k-one").tenant_for(header)


@pytest.mark.parametrize("spec", ["acme", "acme:", "a:b:c,a:b:c", "bad tenant:k", "x{y}:k"])
def test_malformed_key_spec_is_a_config_error_without_the_key(spec: str) -> None:
    """A bad PREFIT_API_KEYS is refused at start-up, never echoing a key."""
    with pytest.raises(ConfigError) as info:
        KeyRing.parse(spec)
    assert "b:c" not in str(info.value)


def test_no_keys_means_local_tenant_and_loopback_only() -> None:
    """Open mode: one local tenant, and the CLI must bind to loopback."""
    assert KeyRing.parse("").tenant_for(None) == LOCAL_TENANT
    assert requires_loopback(Settings(api_keys="")) is True
    assert requires_loopback(Settings(api_keys="acme:k")) is False


def test_open_mode_warns_at_start_up(
    redis_url: str, store: Store, recorder: Recorder, model: str
) -> None:
    """Start-up without keys logs a warning saying the server must stay on loopback."""
    app = create_app(make_settings(redis_url, model, api_keys=""), store=store, enqueue=recorder)
    with structlog.testing.capture_logs() as logs, TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
    [warning] = [e for e in logs if e["event"] == "api.open_mode"]
    assert warning["log_level"] == "warning" and "loopback" in warning["detail"]


def test_requests_without_a_valid_key_are_401(client: TestClient, model: str) -> None:
    """No key or a wrong key: 401 with WWW-Authenticate, and nothing is stored."""
    cid = conv_id()
    url = f"/v1/conversations/{cid}/messages"
    r = client.post(url, json=body(chat(1), model), headers={"Authorization": ""})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "Unauthorized"
    r = client.post(url, json=body(chat(1), model), headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "nope" not in r.text
    assert client.get(f"/v1/conversations/{cid}").status_code == 404


def test_health_and_metrics_need_no_key(client: TestClient) -> None:
    """/healthz, /readyz and /metrics answer without a key."""
    plain = {"Authorization": ""}
    assert client.get("/healthz", headers=plain).status_code == 200
    assert client.get("/readyz", headers=plain).status_code == 200
    assert client.get("/metrics", headers=plain).status_code == 200


def test_the_root_page_points_at_the_docs(client: TestClient) -> None:
    """`/` answers a short HTML page, without a key, linking /docs."""
    r = client.get("/", headers={"Authorization": ""})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'href="/docs"' in r.text


def test_tenants_never_see_each_other(
    redis_url: str, store: Store, recorder: Recorder, model: str
) -> None:
    """Tenant B gets 404 for tenant A's conversation, even with identical content."""
    a, b = f"ta-{uuid.uuid4().hex[:8]}", f"tb-{uuid.uuid4().hex[:8]}"
    settings = make_settings(redis_url, model, api_keys=f"{a}:key-a,{b}:key-b")
    app = create_app(settings, store=store, enqueue=recorder)
    cid, msgs = conv_id(), chat(3)
    with (
        TestClient(app, headers={"Authorization": "Bearer key-a"}) as ca,
        TestClient(app, headers={"Authorization": "Bearer key-b"}) as cb,
    ):
        assert (
            ca.post(f"/v1/conversations/{cid}/messages", json=body(msgs, model)).status_code == 200
        )
        assert cb.get(f"/v1/conversations/{cid}").status_code == 404
        assert cb.post(f"/v1/conversations/{cid}/prepare", json={"model": model}).status_code == 404
        assert cb.delete(f"/v1/conversations/{cid}").status_code == 204
        r = cb.post(f"/v1/conversations/{cid}/messages", json=body(msgs, model, expected_length=0))
        assert r.status_code == 200 and r.json()["length"] == 7  # B's own conversation
        assert ca.get(f"/v1/conversations/{cid}").json()["length"] == 7
        ca.post(f"/v1/conversations/{cid}/messages", json=body(chat(1, system=False), model))
        assert cb.get(f"/v1/conversations/{cid}").json()["length"] == 7
        assert ca.get(f"/v1/conversations/{cid}").json()["length"] == 9


async def _asgi(
    app: FastAPI,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    declared: int | None = None,
) -> tuple[int, bytes, int]:
    """`method path` straight into the app's ASGI callable: (status, body, how many times the
    app asked for the request's body)."""
    asked = 0
    length = len(body) if declared is None else declared
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(length).encode()), *headers],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, content, asked


BODIES = {
    "none": (b"", None),
    "valid": (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', None),
    "truncated": (b'{"model": "m", "messages": [{"role": "us', None),
    "NaN": (b'{"model": "m", "pressure": NaN}', None),
    "90 MB declared": (b"", 90 * 1024 * 1024),
}
EXPLICIT = [
    ("POST", "/v1/prepare"), ("POST", "/v1/observe"), ("POST", "/v1/conversations/c/messages"),
    ("PUT", "/v1/conversations/c"), ("GET", "/v1/conversations/c"),
    ("DELETE", "/v1/conversations/c"), ("POST", "/v1/conversations/c/prepare"),
    ("GET", "/v1/prepare"), ("POST", "/v1/conversations/a:b/messages"),
]  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path"), EXPLICIT)
@pytest.mark.parametrize("auth", [None, b"Bearer nope", b"Basic x"])
async def test_the_key_is_checked_before_a_byte_of_the_body_is_read(
    settings: Settings, store: Store, method: str, path: str, auth: bytes | None
) -> None:
    """Every route of the explicit API, any method, any body (none, valid, truncated, NaN, a
    declared 90 MB): the same 401, and the app never asked for the body."""
    app = create_app(settings, store=store, enqueue=Recorder())
    headers = [(b"authorization", auth)] if auth is not None else []
    answers = set()
    for raw, declared in BODIES.values():
        status, content, asked = await _asgi(app, method, path, headers, raw, declared)
        assert (status, asked) == (401, 0), (method, path, raw[:20], declared)
        answers.add(content)
    assert len(answers) == 1 and b"Unauthorized" in answers.pop()


@pytest.mark.anyio
async def test_a_good_key_still_reaches_the_body(
    settings: Settings, store: Store, tenant: str, model: str
) -> None:
    """With the tenant's key the request is read and answered as before (NaN: a 400 naming
    where it is)."""
    app = create_app(settings, store=store, enqueue=Recorder())
    auth = [(b"authorization", f"Bearer {key_of(tenant)}".encode())]
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "hi", "w": NaN}]}'
    status, content, asked = await _asgi(app, "POST", "/v1/prepare", auth, raw % model.encode())
    assert (status, asked) == (400, 1) and b"at messages[0].w" in content
