"""Fixtures of the proxy tests: a fake provider and the API under real uvicorn, on real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from api.app import create_app
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.server import serve
from tests.fakeprovider import FakeProvider


@dataclass
class Proxy:
    """The API under uvicorn in front of a fake provider."""

    url: str
    key: str
    settings: Settings
    store: Store
    fake: FakeProvider
    recorder: Recorder

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


def proxy_settings(redis_url: str, model: str, tenant: str, fake_url: str, **extra: Any) -> Settings:
    return make_settings(
        redis_url,
        model,
        api_keys=f"{tenant}:{key_of(tenant)}",
        openai_base_url=f"{fake_url}/v1",
        openai_api_key="sk-upstream-openai",
        anthropic_base_url=fake_url,
        anthropic_api_key="sk-upstream-anthropic",
        **extra,
    )


@pytest.fixture
def proxy(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder
) -> Iterator[Proxy]:
    """The API (uvicorn, real Redis) forwarding to `fake` (uvicorn), as the test's tenant."""
    with serve(fake.app) as fake_url:
        settings = proxy_settings(redis_url, model, tenant, fake_url)
        store = Store.from_url(redis_url, settings)
        try:
            with serve(create_app(settings, store=store, enqueue=recorder)) as url:
                yield Proxy(url, key_of(tenant), settings, store, fake, recorder)
        finally:
            store.close()
