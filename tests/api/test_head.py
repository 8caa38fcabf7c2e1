"""`HEAD` is answered as `GET` is, without the body, on real HTTP (uvicorn)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import Recorder
from tests.api.proxy.conftest import Proxy, serving
from tests.fakeprovider import FakeProvider

VARY = frozenset({"date"})


@pytest.fixture
def api(redis_url: str, tenant: str, model: str, recorder: Recorder) -> Iterator[Proxy]:
    """The API under uvicorn, its upstreams a fake provider."""
    with serving(redis_url, tenant, model, FakeProvider(), recorder) as proxy:
        yield proxy


@pytest.mark.parametrize(
    "path", ["/", "/healthz", "/v1/models", "/v1/models/fake-model", "/v1/chat/completions"]
)
def test_head_answers_as_get_without_the_body(api: Proxy, path: str) -> None:
    """Same status and headers (content-length included) as `GET`, and no body."""
    auth = {"authorization": f"Bearer {api.key}"}
    got = httpx.get(api.url + path, headers=auth)
    head = httpx.head(api.url + path, headers=auth)
    assert head.status_code == got.status_code and got.status_code in (200, 404)
    assert head.content == b"" and got.content != b""
    same = {k: v for k, v in got.headers.items() if k not in VARY}
    assert {k: v for k, v in head.headers.items() if k not in VARY} == same
    if path == "/":
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/html")


def test_a_proxied_head_goes_upstream_as_a_get(api: Proxy) -> None:
    """`HEAD /v1/models` asks the provider with `GET`: the headers describe that answer."""
    r = httpx.head(f"{api.url}/v1/models", headers={"authorization": f"Bearer {api.key}"})
    assert r.status_code == 200
    [got] = api.fake.received
    assert got.path == "/v1/models"
    assert int(r.headers["content-length"]) > 0


def test_head_of_a_post_only_route_is_refused_as_get_is(api: Proxy) -> None:
    """A route without `GET` (`/v1/prepare`) refuses `HEAD` as it refuses `GET`: 405 with
    `Allow` (the key first: without one, 401)."""
    auth = {"authorization": f"Bearer {api.key}"}
    for method in ("GET", "HEAD"):
        r = httpx.request(method, f"{api.url}/v1/prepare", headers=auth)
        assert (r.status_code, r.headers.get("allow")) == (405, "POST")
        assert httpx.request(method, f"{api.url}/v1/prepare").status_code == 401
