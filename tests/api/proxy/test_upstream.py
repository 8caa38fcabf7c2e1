"""The upstreams tenants share: no cookie crosses requests, and each tenant's share of the
upstream is capped (429 past it) so a tenant holding streams never delays another."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.app import create_app
from api.proxy.upstream import UpstreamShare
from shared.errors import OverShare
from shared.store import Store
from tests.api.conftest import Recorder
from tests.api.proxy.conftest import proxy_settings
from tests.api.server import serve
from tests.fakeprovider import FakeProvider

CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Tenants:
    """The API with two tenants in front of one provider."""

    url: str
    alice: str
    bob: str
    metrics_token: str

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer key-{tenant}"}


@contextmanager
def two_tenants(redis_url: str, model: str, upstream: Starlette, **extra: Any) -> Iterator[Tenants]:
    """`alice` and `bob` (unique names) on the API, forwarding to `upstream`."""
    alice, bob = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("alice", "bob"))
    with serve(upstream) as upstream_url:
        settings = proxy_settings(redis_url, model, alice, upstream_url, **extra).model_copy(
            update={
                "api_keys": f"{alice}:key-{alice},{bob}:key-{bob}",
                "metrics_token": SecretStr("metrics-secret"),
            }
        )
        store = Store.from_url(redis_url, settings)
        try:
            with serve(create_app(settings, store=store, enqueue=Recorder())) as url:
                yield Tenants(url, alice, bob, "metrics-secret")
        finally:
            store.close()


class CookieSetter:
    """An OpenAI-compatible chat endpoint behind a CDN that sets cookies, as Cloudflare does
    in front of OpenAI's and Anthropic's APIs (`__cf_bm`, `_cfuvid`, one `Set-Cookie` each):
    records the `Cookie` header of every request it gets."""

    def __init__(self) -> None:
        self.cookies: list[str | None] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self.app.router.routes.append(Route("/v1/models", self._chat, methods=["GET"]))

    async def _chat(self, request: Request) -> Response:
        self.cookies.append(request.headers.get("cookie"))
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-x",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
        response = JSONResponse(answer)
        n = len(self.cookies)
        response.set_cookie("__cf_bm", f"session-{n}", domain="api.openai.com")
        response.set_cookie("_cfuvid", f"visitor-{n}", domain="api.openai.com")
        return response


def test_no_cookie_a_provider_sets_goes_upstream_again_or_back(redis_url: str, model: str) -> None:
    """alice's answer sets two cookies; neither comes back to her, and no later request
    (bob's chat, bob's model list, alice's own next one) carries a cookie upstream."""
    fake = CookieSetter()
    with two_tenants(redis_url, model, fake.app) as t:
        first = httpx.post(f"{t.url}/v1/chat/completions", json=CHAT, headers=t.headers(t.alice))
        assert first.status_code == 200 and "set-cookie" not in first.headers
        for tenant in (t.bob, t.alice):
            r = httpx.post(f"{t.url}/v1/chat/completions", json=CHAT, headers=t.headers(tenant))
            assert r.status_code == 200 and "set-cookie" not in r.headers
        assert httpx.get(f"{t.url}/v1/models", headers=t.headers(t.bob)).status_code == 200
    assert fake.cookies == [None, None, None, None]


def _metric(text: str, name: str) -> float:
    found = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(found[0]) if found else float("nan")


def test_a_tenant_holding_its_share_never_delays_another(redis_url: str, model: str) -> None:
    """bob opens 220 streams whose upstream sent its headers and then nothing: 8 of them hold
    his share (cap 8 here, the pool 200), the rest are answered 429 with Retry-After in
    OpenAI's shape at once; alice's chat is answered 200 meanwhile, and bob's again once his
    streams end. /metrics shows the share, per tenant only with the metrics token."""
    fake = FakeProvider(event_delay=3600)  # a stream: headers, then nothing for an hour
    # the deadline is the machine's, not the test's: 220 requests at once on a busy 2-core VM
    limits = {"upstream_tenant_max_requests": 8, "request_deadline_s": 30.0}
    with two_tenants(redis_url, model, fake.app, **limits) as t:
        asyncio.run(_held_streams(t))


async def _held_streams(t: Tenants) -> None:
    stream = {**CHAT, "stream": True}
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=300)) as bob:
        opened = [
            bob.stream(
                "POST", f"{t.url}/v1/chat/completions", json=stream, headers=t.headers(t.bob)
            )
            for _ in range(220)
        ]
        answers = await asyncio.gather(*(s.__aenter__() for s in opened))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * 8 + [429] * 212, {s: statuses.count(s) for s in set(statuses)}
        refused = next(a for a in answers if a.status_code == 429)
        await refused.aread()
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        async with httpx.AsyncClient(timeout=10) as alice:
            r = await alice.post(
                f"{t.url}/v1/chat/completions", json=CHAT, headers=t.headers(t.alice)
            )
            assert r.status_code == 200
            public = (await alice.get(f"{t.url}/metrics")).text
            private = (
                await alice.get(
                    f"{t.url}/metrics", headers={"Authorization": "Bearer metrics-secret"}
                )
            ).text
        assert _metric(public, "prefit_upstream_in_flight") == 8
        assert _metric(public, "prefit_upstream_tenant_cap") == 8
        assert t.bob not in public and "prefit_tenant_upstream_in_flight" not in public
        assert f'prefit_tenant_upstream_in_flight{{tenant="{t.bob}"}} 8.0' in private
        assert f'prefit_tenant_upstream_share_refused_total{{tenant="{t.bob}"}} 212.0' in private
        await asyncio.gather(*(s.__aexit__(None, None, None) for s in opened))
    async with httpx.AsyncClient(timeout=10) as again:
        for _ in range(100):  # the proxy hears the streams closed within moments
            r = await again.post(
                f"{t.url}/v1/chat/completions", json=CHAT, headers=t.headers(t.bob)
            )
            if r.status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 200


def test_a_streamed_answer_gives_its_place_back_however_it_ends() -> None:
    """The share's bookkeeping: a place is given back once, whatever closes it; past the
    cap `OverShare` says the retry time."""
    share = UpstreamShare(2)
    first, second = share.take("bob"), share.take("bob")
    with pytest.raises(OverShare) as caught:
        share.take("bob")
    assert caught.value.retry_after == 1
    share.take("alice")()  # another tenant's place is its own
    first()
    first()  # twice: still one place
    assert share.counts() == ({"bob": 1}, {"bob": 1})
    second()
    assert share.counts()[0] == {}
