"""Fixtures of the proxy tests: a fake provider and the API under real uvicorn, on real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from api.app import create_app
from shared.counting.counters import HeuristicCounter
from shared.messages import Message, ToolSpec, validate
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import RESERVE, WINDOW, Recorder, key_of, make_settings
from tests.api.server import serve
from tests.builders import assistant, call, result, user
from tests.fakeprovider import FakeProvider

BUDGET = WINDOW - RESERVE
TASK = "Find why the cache is slow and fix it."
TOOLS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def agent_session(turns: int, output_chars: int = 1200) -> list[Message]:
    """A coding-agent transcript: system, the task, then tool calls with long outputs and
    some prose; about `turns` x (output_chars / 3.5 + 60) tokens."""
    out: list[Message] = [{"role": "system", "content": "You are a careful agent."}, user(TASK)]
    for k in range(turns):
        out.append(call(f"call_{k}", args=f'{{"cmd": "grep -rn cache src/ # {k}"}}'))
        out.append(
            result(f"call_{k}", f"src/cache.py:{k}: " + "lookup miss " * (output_chars // 12))
        )
        if k % 5 == 4:
            out.append(user(f"status of step {k}? " + "please explain " * 20))
            out.append(assistant(f"step {k}: " + "still looking " * 20))
    return out


def sent_fits(messages: list[Message], tools: list[ToolSpec]) -> bool:
    """The request fits the budget as prefit counts (the fake counts the same)."""
    return HeuristicCounter().count(validate(messages), tools) <= BUDGET


@dataclass
class Proxy:
    """The API under uvicorn in front of a fake provider."""

    url: str
    key: str
    settings: Settings
    store: Store
    fake: FakeProvider
    recorder: Recorder
    tenant: str

    @property
    def model(self) -> str:
        return next(iter(self.settings.models))

    def info(self, conv_id: str) -> dict[str, Any]:
        """`GET /v1/conversations/{id}` (404 as {})."""
        r = httpx.get(
            f"{self.url}/v1/conversations/{conv_id}",
            headers={"Authorization": f"Bearer {self.key}"},
        )
        return r.json() if r.status_code == 200 else {}


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """The first truthy value of `predicate`, polled (for work done after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def fake() -> FakeProvider:
    """A fake provider that refuses prompts over its window (the API's window, 20,000)."""
    return FakeProvider(limit_tokens=20_000)


def proxy_settings(
    redis_url: str, model: str, tenant: str, fake_url: str, **extra: Any
) -> Settings:
    """The test's settings, with every upstream pointing at the fake provider (`extra` over
    them, the tenants' keys included)."""
    base: dict[str, Any] = {
        "api_keys": f"{tenant}:{key_of(tenant)}",
        "openai_base_url": f"{fake_url}/v1",
        "openai_api_key": "sk-upstream-openai",
        "anthropic_base_url": fake_url,
        "anthropic_api_key": "sk-upstream-anthropic",
        "gemini_base_url": fake_url,
        "gemini_api_key": "upstream-gemini-key",
    }
    return make_settings(redis_url, model, **{**base, **extra})


@contextmanager
def serving(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder, **extra: Any
) -> Iterator[Proxy]:
    """The API (uvicorn, real Redis) forwarding to `fake` (uvicorn), as `tenant`; `extra`
    settings over the test's."""
    with serve(fake.app) as fake_url:
        settings = proxy_settings(redis_url, model, tenant, fake_url, **extra)
        store = Store.from_url(redis_url, settings)
        try:
            with serve(create_app(settings, store=store, enqueue=recorder)) as url:
                yield Proxy(url, key_of(tenant), settings, store, fake, recorder, tenant)
        finally:
            store.close()


@pytest.fixture
def proxy(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder
) -> Iterator[Proxy]:
    """The API (uvicorn, real Redis) forwarding to `fake` (uvicorn), as the test's tenant."""
    with serving(redis_url, tenant, model, fake, recorder) as proxy:
        yield proxy
