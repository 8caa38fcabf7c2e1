"""The fake provider itself: what tests and benchmarks rely on."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from shared.providers import OpenAIClient, http_timeout
from tests.fakellm import Failure, FakeLLM, answer_for

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}


def test_answer_is_derived_from_the_prompt(fake: FakeLLM) -> None:
    """Same prompt, same answer; the call records size, hash and text."""
    first = httpx.post(f"{fake.base_url}/chat/completions", json=BODY).json()
    second = httpx.post(f"{fake.base_url}/chat/completions", json=BODY).json()
    assert first["choices"][0]["message"]["content"] == answer_for("hello")
    assert first == second
    call = fake.calls[0]
    assert (call.prompt, call.chars, call.sha1) == ("hello", 5, hashlib.sha1(b"hello").hexdigest())
    assert answer_for("hello") == f"SUMMARY {call.sha1[:8]} of 5 chars"


def test_script_is_consumed_in_order_then_reset(fake: FakeLLM) -> None:
    """Scripted failures answer the next requests in order; reset forgets calls and script."""
    fake.script(Failure(429, headers={"retry-after-ms": "5"}), 401)
    url = f"{fake.base_url}/messages"
    first, second, third = (httpx.post(url, json=BODY) for _ in range(3))
    assert (first.status_code, second.status_code, third.status_code) == (429, 401, 200)
    assert first.headers["retry-after-ms"] == "5"
    assert first.json()["error"]["type"] == "rate_limit_error"
    fake.script(500)
    fake.reset()
    assert fake.calls == []
    assert httpx.post(url, json=BODY).status_code == 200


def test_context_limit_answers_with_the_protocols_error(fake: FakeLLM) -> None:
    """Over context_limit_chars, each protocol gets its own context-length error."""
    fake.context_limit_chars = 3
    openai = httpx.post(f"{fake.base_url}/chat/completions", json=BODY)
    anthropic = httpx.post(f"{fake.base_url}/messages", json=BODY)
    assert openai.status_code == anthropic.status_code == 400
    assert openai.json()["error"]["code"] == "context_length_exceeded"
    assert anthropic.json()["error"]["message"].startswith("prompt is too long")


@pytest.mark.slow
async def test_three_hundred_slow_requests_in_flight_at_once() -> None:
    """300 concurrent calls of one provider client are all in flight together, all answered."""
    with FakeLLM(delay=0.05, gate=300) as fake:
        client = OpenAIClient(fake.base_url, None, timeout=http_timeout(30, 5), max_connections=300)
        texts = await _concurrent(client, 300)
        assert texts == [answer_for(f"request {i}") for i in range(300)]
        assert fake.max_in_flight >= 300
        assert len(fake.calls) == 300


async def _concurrent(client: OpenAIClient, n: int) -> list[str]:
    try:
        done = await asyncio.gather(
            *(
                client.complete(
                    [{"role": "user", "content": f"request {i}"}], model="m", max_tokens=5
                )
                for i in range(n)
            )
        )
    finally:
        await client.aclose()
    return [d.text for d in done]


@pytest.mark.slow
def test_runs_as_a_separate_process() -> None:
    """`python -m tests.fakellm --port N` serves until terminated."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakellm", "--port", str(port), "--delay", "0.01"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.fullmatch(rf"fakellm listening on http://127\.0\.0\.1:{port}/v1\n", line)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY, timeout=10)
        assert reply.json()["choices"][0]["message"]["content"] == answer_for("hello")
        stats = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=10).json()
        assert stats["calls"] == 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("fakellm did not stop on SIGINT")
