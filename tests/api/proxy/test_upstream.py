"""A provider slower than prefit's deadline is answered whole on all three APIs: the wait on
it is bounded by the upstream timeouts, and a client that goes away still cancels it."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from shared.commands.redisproc import RedisProcess
from tests.api.conftest import Recorder
from tests.api.proxy.conftest import Proxy, serving, wait_for
from tests.builders import user
from tests.fakeprovider import WORDS, FakeProvider, Pace

TEXT = "".join(WORDS)
FAST_DEADLINE_S = 0.5  # the fast tests' deadline, so a provider of 1-1.5 s outlasts it

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
    """A 0.5 s deadline in front of a provider answering after 1.5 s, pausing 1 s twice in a
    stream (each longer than the deadline)."""
    pace = Pace(headers=1.5, events=0.002, pauses={2: 1.0, 5: 1.0})
    with slow(
        redis_url, tenant, model, recorder, pace, request_deadline_s=FAST_DEADLINE_S
    ) as proxy:
        yield proxy


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", sorted(ASKS))
def test_a_provider_slower_than_the_deadline_is_answered_whole(
    late: Proxy, api: str, stream: bool
) -> None:
    """1.5 s before the answer (and 1 s pauses in a stream) against a 0.5 s deadline: the
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
    with slow(redis_url, tenant, model, recorder, Pace(headers=seconds)) as proxy:
        assert proxy.settings.request_deadline_s == 2.0
        assert all_apis(proxy, stream=False) == dict.fromkeys(ASKS, TEXT)


@pytest.mark.slow
def test_a_stream_with_long_pauses_reaches_the_client_at_the_default_deadline(
    redis_url: str, tenant: str, model: str, recorder: Recorder
) -> None:
    """A stream opening after 3.5 s, then pausing 3 s twice: whole, on every API."""
    pace = Pace(headers=3.5, events=0.01, pauses={2: 3.0, 4: 3.0})
    with slow(redis_url, tenant, model, recorder, pace) as proxy:
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
    """Redis frozen (SIGSTOP), a provider taking 1 s: prefit's own work stays within the
    deadline, so the answer comes within deadline + the provider's time (200, fitted without
    the store, or 503 before the provider was called), never later."""
    pace = Pace(headers=1.0)
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
