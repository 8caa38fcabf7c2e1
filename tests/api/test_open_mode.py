"""Open mode (no API keys) serves loopback only, enforced by the app itself: a real uvicorn
bound to 0.0.0.0 refuses requests that arrive on another address of this machine, unless
the operator set PREFIT_ALLOW_OPEN=true; a non-loopback PREFIT_HOST refuses to start."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app, requires_loopback
from api.auth import arrived_locally, is_loopback
from shared.errors import ConfigError
from shared.settings import Settings
from tests.api.conftest import Recorder, make_settings
from tests.api.server import serve


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback (None if it has none)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # picks the outgoing interface; sends nothing
        address: str = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if is_loopback(address) or address == "0.0.0.0" else address


@pytest.fixture
def address() -> str:
    found = non_loopback_address()
    if found is None:
        pytest.skip("this machine has no non-loopback IPv4 address to send a request to")
    return found


def urls(base: str, address: str) -> tuple[str, str]:
    port = urlsplit(base).port
    return f"http://127.0.0.1:{port}", f"http://{address}:{port}"


def test_open_mode_on_0000_refuses_requests_on_other_addresses(
    redis_url: str, model: str, address: str
) -> None:
    """No keys, no opt-in: loopback is served; the machine's other address gets 403 saying
    which two settings fix it, on every route."""
    app = create_app(make_settings(redis_url, model, api_keys=""), enqueue=Recorder())
    with serve(app, host="0.0.0.0") as base:
        local, remote = urls(base, address)
        assert httpx.get(f"{local}/healthz").status_code == 200
        hello = [{"role": "user", "content": "hello"}]
        assert httpx.post(
            f"{local}/v1/prepare", json={"messages": hello, "model": model}
        ).is_success
        for path in ("/healthz", "/metrics", "/v1/conversations/c1"):
            r = httpx.get(f"{remote}{path}")
            assert r.status_code == 403, (path, r.text)
            error = r.json()["error"]
            assert error["type"] == "Forbidden"
            assert "PREFIT_API_KEYS" in error["message"] and "PREFIT_ALLOW_OPEN" in error["message"]
            assert address in error["message"]


def test_the_opt_in_or_keys_serve_other_addresses(redis_url: str, model: str, address: str) -> None:
    """PREFIT_ALLOW_OPEN=true serves the other address; with keys, keys decide."""
    opened = make_settings(redis_url, model, api_keys="", allow_open=True)
    with serve(create_app(opened, enqueue=Recorder()), host="0.0.0.0") as base:
        assert httpx.get(f"{urls(base, address)[1]}/healthz").status_code == 200
    keyed = make_settings(redis_url, model, api_keys="acme:secret")
    with serve(create_app(keyed, enqueue=Recorder()), host="0.0.0.0") as base:
        remote = urls(base, address)[1]
        assert httpx.get(f"{remote}/v1/conversations/c1").status_code == 401
        headers = {"Authorization": "Bearer secret"}
        assert httpx.get(f"{remote}/v1/conversations/c1", headers=headers).status_code == 404


def test_open_mode_with_a_non_loopback_host_refuses_to_start(redis_url: str, model: str) -> None:
    """PREFIT_HOST=0.0.0.0 without keys or the opt-in: start-up fails naming both settings."""
    app = create_app(make_settings(redis_url, model, api_keys="", host="0.0.0.0"))
    with pytest.raises(ConfigError, match="PREFIT_ALLOW_OPEN=true") as info, TestClient(app):
        pass
    assert "PREFIT_API_KEYS" in str(info.value)
    allowed = make_settings(redis_url, model, api_keys="", host="0.0.0.0", allow_open=True)
    with TestClient(create_app(allowed, enqueue=Recorder())) as c:
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "server, local",
    [
        (("127.0.0.1", 80), True),
        (("::1", 80), True),
        (("::ffff:127.0.0.1", 80), True),
        (("10.1.2.3", 80), False),
        (("fd00::2", 80), False),
        (("/run/prefit.sock", None), True),
        (None, False),
    ],
)
def test_which_local_addresses_count_as_loopback(server: object, local: bool) -> None:
    """Loopback IPs (and IPv4-mapped ones) and socket paths are local; other IPs and an
    unknown address are not."""
    assert arrived_locally({"type": "http", "server": server}) is local


def test_the_cli_is_told_the_same(redis_url: str) -> None:
    """requires_loopback: open mode without the opt-in."""
    assert requires_loopback(Settings(api_keys="")) is True
    assert requires_loopback(Settings(api_keys="", allow_open=True)) is False
    assert requires_loopback(Settings(api_keys="a:k")) is False
