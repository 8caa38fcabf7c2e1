"""A provider slower than prefit's deadline is answered whole on all three APIs: the wait on
it is bounded by the upstream timeouts, and a client that goes away still cancels it. No
cookie crosses requests, and each tenant's share of the upstream is capped (429 past it), so
a tenant holding streams never delays another."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.app import create_app
from api.proxy.upstream import UpstreamShare
from shared.commands.redisproc import RedisProcess
from shared.errors import OverShare
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder
from tests.api.proxy.conftest import Proxy, proxy_settings, serving, wait_for
from tests.api.server import serve
from tests.builders import user
from tests.fakeprovider import WORDS, FakeProvider, Pace

TEXT = "".join(WORDS)
# the fast tests' deadline, so a provider of 1.5 s outlasts it: at 0.5 s a cold app's first
# request on a loaded 2-core machine once spent it before the provider was called (503)
FAST_DEADLINE_S = 1.0
DEFAULT_S = Settings.model_fields["request_deadline_s"].default  # what a deployment runs on

Ask = Callable[[Proxy, bool], str]


def ask_chat(proxy: Proxy, stream: bool) -> str:
    """The answer's text through the OpenAI SDK's Chat Completions."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)
    with client:
        hi: Any = [user("hi")]
        if not stream:
            answer = client.chat.completions.create(model=proxy.model, messages=hi)
            return str(answer.choices[0].message.content)
        chunks = client.chat.completions.create(model=proxy.model, messages=hi, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def ask_responses(proxy: Proxy, stream: bool) -> str:
    """The answer's text through the OpenAI SDK's Responses API."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)
    with client:
        if not stream:
            return client.responses.create(model=proxy.model, input="hi").output_text
        with client.responses.stream(model=proxy.model, input="hi") as events:
            return events.get_final_response().output_text


def ask_messages(proxy: Proxy, stream: bool) -> str:
    """The answer's text through the Anthropic SDK's Messages."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0)
    with client:
        if not stream:
            answer = client.messages.create(
                model=proxy.model, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
            )
            return "".join(b.text for b in answer.content if b.type == "text")
        with client.messages.stream(
            model=proxy.model, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        ) as events:
            return events.get_final_text()


ASKS: dict[str, Ask] = {"chat": ask_chat, "responses": ask_responses, "messages": ask_messages}


def slow(
    redis_url: str, tenant: str, model: str, recorder: Recorder, pace: Pace, **extra: Any
) -> Any:
    """The proxy in front of a fake provider taking `pace`."""
    fake = FakeProvider(pace=pace, words=WORDS)
    return serving(redis_url, tenant, model, fake, recorder, **extra)


@pytest.fixture
def late(redis_url: str, tenant: str, model: str, recorder: Recorder) -> Iterator[Proxy]:
    """A 1 s deadline in front of a provider answering after 1.5 s, pausing 1.2 s twice in a
    stream (each longer than the deadline)."""
    pace = Pace(headers=1.5, events=0.002, pauses={2: 1.2, 5: 1.2})
    with slow(
        redis_url, tenant, model, recorder, pace, request_deadline_s=FAST_DEADLINE_S
    ) as proxy:
        yield proxy


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", sorted(ASKS))
def test_a_provider_slower_than_the_deadline_is_answered_whole(
    late: Proxy, api: str, stream: bool
) -> None:
    """1.5 s before the answer (and 1.2 s pauses in a stream) against a 1 s deadline: the
    client gets the provider's whole answer, its prompt synced as usual."""
    started = time.monotonic()
    assert ASKS[api](late, stream) == TEXT
    assert time.monotonic() - started >= 1.5  # it did wait for the provider
    [got] = late.fake.received
    assert got.status == 200 and late.fake.cancelled == 0


def all_apis(proxy: Proxy, stream: bool) -> dict[str, str]:
    """Every API asked at once (the provider's time overlaps), each answer's text."""
    with ThreadPoolExecutor(len(ASKS)) as pool:
        futures = {api: pool.submit(ask, proxy, stream) for api, ask in ASKS.items()}
        return {api: f.result() for api, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [3.5, 25.0])
def test_answers_after_seconds_reach_the_client_at_the_default_deadline(
    redis_url: str, tenant: str, model: str, recorder: Recorder, seconds: float
) -> None:
    """The default 2 s deadline; a provider answering after 3.5 s or 25 s (a long reply):
    every API's client gets the whole answer."""
    pace = Pace(headers=seconds)
    with slow(redis_url, tenant, model, recorder, pace, request_deadline_s=DEFAULT_S) as proxy:
        assert proxy.settings.request_deadline_s == 2.0
        assert all_apis(proxy, stream=False) == dict.fromkeys(ASKS, TEXT)


@pytest.mark.slow
def test_a_stream_with_long_pauses_reaches_the_client_at_the_default_deadline(
    redis_url: str, tenant: str, model: str, recorder: Recorder
) -> None:
    """A stream opening after 3.5 s, then pausing 3 s twice: whole, on every API."""
    pace = Pace(headers=3.5, events=0.01, pauses={2: 3.0, 4: 3.0})
    with slow(redis_url, tenant, model, recorder, pace, request_deadline_s=DEFAULT_S) as proxy:
        assert all_apis(proxy, stream=True) == dict.fromkeys(ASKS, TEXT)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_a_client_gone_before_the_answer_cancels_the_upstream_call(
    redis_url: str, tenant: str, model: str, recorder: Recorder, path: str, stream: bool
) -> None:
    """The client hangs up while the provider still thinks (30 s): prefit closes its upstream
    request then (the provider sees it go), not when the provider answers."""
    with slow(redis_url, tenant, model, recorder, Pace(headers=30.0)) as proxy:
        body: dict[str, Any] = {"model": model, "max_tokens": 100, "stream": stream}
        body |= {"input": "hi"} if path == "/v1/responses" else {"messages": [user("hi")]}
        payload = json.dumps(body).encode()
        host, port = proxy.url.removeprefix("http://").split(":")
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {proxy.key}\r\nanthropic-version: 2023-06-01\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        )
        with socket.create_connection((host, int(port))) as client:
            client.sendall(head.encode() + payload)
            wait_for(lambda: proxy.fake.received)  # the provider is thinking
        wait_for(lambda: proxy.fake.cancelled == 1, timeout=5.0)


def test_a_provider_silent_past_the_read_timeout_is_a_504(
    redis_url: str, tenant: str, model: str, recorder: Recorder
) -> None:
    """The wait on the provider is bounded by `PREFIT_UPSTREAM_READ_TIMEOUT_S` (between two
    bytes), answered in the provider's error shape."""
    with slow(
        redis_url, tenant, model, recorder, Pace(headers=5.0), upstream_read_timeout_s=0.5
    ) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)
        started = time.monotonic()
        with client, pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=model, messages=[user("hi")])  # type: ignore[list-item]
        assert refused.value.status_code == 504
        assert refused.value.message.endswith("openai upstream timed out")
        assert time.monotonic() - started < 3.0


@pytest.mark.slow
def test_a_frozen_redis_still_answers_a_proxied_request_within_the_deadline(
    own_redis: RedisProcess,
    tenant: str,
    model: str,
    recorder: Recorder,
) -> None:
    """Redis frozen (SIGSTOP), a provider taking 1.5 s: prefit's own work stays within the
    deadline, so the answer comes within deadline + the provider's time (200, fitted without
    the store, or 503 before the provider was called), never later."""
    pace = Pace(headers=1.5)
    with slow(
        own_redis.url, tenant, model, recorder, pace, request_deadline_s=FAST_DEADLINE_S
    ) as proxy:
        assert ask_chat(proxy, False) == TEXT  # the connections are made
        assert own_redis.pid is not None
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                client = httpx.Client(base_url=proxy.url, timeout=30)
                body = {"model": model, "messages": [user("hi again")]}
                headers = {"Authorization": f"Bearer {proxy.key}"}
                started = time.monotonic()
                with client:
                    r = client.post("/v1/chat/completions", json=body, headers=headers)
                took = time.monotonic() - started
                assert r.status_code in {200, 503}, r.text
                assert took < FAST_DEADLINE_S + pace.headers + 1.0, took
                if r.status_code == 503:
                    assert took < FAST_DEADLINE_S + 1.0
                    assert r.json()["error"]["type"] == "StoreUnavailable"
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)


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
    fake = FakeProvider(
        pace=Pace(events=3600.0)
    )  # a stream: headers, its first event, then an hour of nothing
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
