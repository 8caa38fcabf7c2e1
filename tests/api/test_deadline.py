"""Every route answers within the request deadline whatever Redis does: frozen (SIGSTOP) or
dead (killed). A conversation this process has cached is still prepared, marked degraded."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from api.app import create_app
from api.deadline import RequestDeadline, upstream_wait
from shared.commands.redisproc import RedisProcess
from tests.api.conftest import Recorder, make_settings
from tests.api.helpers import body, conv_id
from tests.api.server import serve
from tests.builders import chat, user

pytestmark = pytest.mark.anyio

DEADLINE_S = 1.0
BOUND_S = DEADLINE_S + 1.5  # a correctness bound (answers must not hang), not a speed goal

Call = Callable[[httpx.Client], httpx.Response]


@pytest.fixture
def app(own_redis: RedisProcess, model: str) -> FastAPI:
    """The app as deployed: it builds its own Redis clients, sized to the deadline."""
    settings = make_settings(own_redis.url, model, request_deadline_s=DEADLINE_S)
    return create_app(settings, enqueue=Recorder())


def calls(model: str, cached: str, other: str) -> dict[str, tuple[Call, set[int]]]:
    """Every route, and the statuses it may answer with Redis gone."""
    msgs = chat(12, size=4000)
    unavailable = {503}
    return {
        "append": (
            lambda c: c.post(f"/v1/conversations/{other}/messages", json=body([user("x")], model)),
            unavailable,
        ),
        "put": (lambda c: c.put(f"/v1/conversations/{other}", json=body(msgs, model)), unavailable),
        "get": (lambda c: c.get(f"/v1/conversations/{other}"), unavailable),
        "delete": (lambda c: c.delete(f"/v1/conversations/{other}"), unavailable),
        "prepare uncached": (
            lambda c: c.post(f"/v1/conversations/{other}/prepare", json={"model": model}),
            unavailable,
        ),
        "prepare cached": (
            lambda c: c.post(f"/v1/conversations/{cached}/prepare", json={"model": model}),
            {200},
        ),
        "prepare stateless": (lambda c: c.post("/v1/prepare", json=body(msgs, model)), {200}),
        "observe": (
            lambda c: c.post(
                "/v1/observe", json={**body(msgs, model), "actual_prompt_tokens": 10_000}
            ),
            unavailable,
        ),
        "readyz": (lambda c: c.get("/readyz"), unavailable),
        "healthz": (lambda c: c.get("/healthz"), {200}),
        "metrics": (lambda c: c.get("/metrics"), {200}),
    }


def check_every_route(url: str, model: str, cached: str, other: str) -> dict[str, float]:
    """Call every route once; each answers in time, never 500; returns the latencies."""
    took: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        for name, (call, allowed) in calls(model, cached, other).items():
            started = time.monotonic()
            r = call(c)
            took[name] = time.monotonic() - started
            assert r.status_code in allowed, (name, r.status_code, r.text)
            assert took[name] < BOUND_S, (name, took[name])
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1", name
                assert r.json()["error"]["type"] == "StoreUnavailable", (name, r.text)
            if name.startswith("prepare") and r.status_code == 200:
                assert r.json()["report"]["degraded"] is True, name
            if name == "metrics":
                assert "prefit_store_up 0.0" in r.text
    return took


def setup_conversations(url: str, model: str) -> tuple[str, str]:
    """Two stored conversations; the first is prepared once, so this process caches it."""
    cached, other = conv_id(), conv_id()
    with httpx.Client(base_url=url, timeout=30) as c:
        for cid in (cached, other):
            assert c.put(f"/v1/conversations/{cid}", json=body(chat(12, 4000), model)).is_success
        ok = c.post(f"/v1/conversations/{cached}/prepare", json={"model": model})
        assert ok.status_code == 200 and ok.json()["report"]["degraded"] is False
    return cached, other


@pytest.mark.slow
def test_every_route_answers_in_time_with_redis_frozen(
    app: FastAPI, own_redis: RedisProcess, model: str
) -> None:
    """SIGSTOP: no route takes longer than the deadline (+ margin); the cached conversation's
    prepare answers 200 degraded; after SIGCONT everything works again."""
    with serve(app) as url:
        cached, other = setup_conversations(url, model)
        assert own_redis.pid is not None
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            check_every_route(url, model, cached, other)
            check_every_route(url, model, cached, other)  # with connections already timed out
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post(f"/v1/conversations/{other}/messages", json=body([user("back")], model))
            assert r.status_code == 200, r.text
            assert c.get("/readyz").status_code == 200
            fresh = c.post(f"/v1/conversations/{cached}/prepare", json={"model": model})
            assert fresh.json()["report"]["degraded"] is False


def test_every_route_answers_in_time_with_redis_killed(
    app: FastAPI, own_redis: RedisProcess, model: str
) -> None:
    """Killed: every route answers in time, the cached conversation's prepare degraded."""
    with serve(app) as url:
        cached, other = setup_conversations(url, model)
        own_redis.kill()
        check_every_route(url, model, cached, other)


@pytest.mark.slow
def test_a_slow_upload_is_not_cut_by_the_deadline(app: FastAPI, model: str) -> None:
    """The deadline runs while the app works, not while the client is still sending."""

    def slow_body() -> Iterator[bytes]:
        payload = httpx.Request("POST", "/", json=body(chat(2), model)).content
        half = len(payload) // 2
        yield payload[:half]
        time.sleep(DEADLINE_S * 1.5)
        yield payload[half:]

    with serve(app) as url:
        r = httpx.post(
            f"{url}/v1/prepare",
            content=slow_body(),
            headers={"content-type": "application/json"},
            timeout=30,
        )
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_requested_wait_extends_the_deadline(app: FastAPI, model: str) -> None:
    """A stale prepare asked to wait longer than the deadline waits, then answers 200."""
    cid = conv_id()
    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.put(f"/v1/conversations/{cid}", json=body(chat(12, 4000), model)).is_success
        wait_ms = int(DEADLINE_S * 1500)
        r = c.post(f"/v1/conversations/{cid}/prepare", json={"model": model, "wait_ms": wait_ms})
    assert r.status_code == 200, r.text
    report: dict[str, Any] = r.json()["report"]
    assert report["stale"] is True and report["waited_ms"] >= wait_ms


async def drive(app: Any, seconds: float) -> list[dict[str, Any]]:
    """Run one request through `RequestDeadline(app)`; what reached the server."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    await RequestDeadline(app, seconds)(scope, receive, send)
    await asyncio.sleep(0.3)  # the abandoned handler finishes meanwhile
    return sent


async def test_a_handler_stuck_in_a_thread_is_answered_503_and_its_late_answer_dropped() -> None:
    """The deadline does not wait for work in a thread; what the handler sends later is lost."""

    async def stuck(scope: Any, receive: Any, send: Any) -> None:
        await run_in_threadpool(time.sleep, 0.2)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})

    started = time.monotonic()
    sent = await drive(stuck, 0.05)
    assert time.monotonic() - started < 0.3 + 0.2  # the 503 did not wait for the thread
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [503]
    assert all(m.get("body") != b"late" for m in sent)


async def test_an_answer_that_started_in_time_is_never_replaced() -> None:
    """Once the response has started, the deadline lets it finish (e.g. background work)."""

    async def slow_tail(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"done"})

    sent = await drive(slow_tail, 0.02)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200]
    assert sent[-1]["body"] == b"done"


async def test_the_wait_on_the_provider_is_not_on_the_deadline() -> None:
    """Inside `upstream_wait` the clock stops: a provider slower than the deadline is waited for."""

    async def proxied(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        async with upstream_wait():
            await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answer"})

    sent = await drive(proxied, 0.05)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200]
    assert sent[-1]["body"] == b"answer"


async def test_after_the_wait_prefits_work_has_only_what_was_left_of_the_deadline() -> None:
    """The clock resumes where it stopped: work before and after the wait adds up (a retry's
    fit after an overflow is still bounded by the deadline)."""

    async def slow_retry(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.12)  # most of the deadline: the first fit
        async with upstream_wait():
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.12)  # the retry's fit: past what was left
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})

    started = time.monotonic()
    sent = await drive(slow_retry, 0.2)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [503]
    assert time.monotonic() - started < 0.12 + 0.2 + 0.12 + 0.3  # not after the late answer


async def test_a_client_gone_while_the_provider_answers_cancels_the_call() -> None:
    """The client's disconnect during the wait cancels the app's task: nothing is answered."""
    cancelled = asyncio.Event()
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(0.05)  # the client goes away while the provider thinks
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def waiting(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            async with upstream_wait():
                await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    started = time.monotonic()
    await RequestDeadline(waiting, 1.0)(scope, receive, send)
    await asyncio.wait_for(cancelled.wait(), 1.0)
    assert time.monotonic() - started < 1.0 and sent == []
