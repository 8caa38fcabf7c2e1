"""Fixtures of the API tests: an app on the suite's Redis with a recording enqueue."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from shared.commands.redisproc import RedisProcess
from shared.service.jobs import SummaryJob
from shared.settings import ModelWindow, Settings
from shared.store import Store
from tests.redisbackend import require_redis_server

WINDOW, RESERVE = 20_000, 1_000  # budget 19000: nearing from 14250 tokens, over from 16150


@dataclass
class Recorder:
    """An `Enqueue` that remembers what it was asked to send."""

    jobs: list[tuple[SummaryJob, int]] = field(default_factory=list)
    fail: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, job: SummaryJob, priority: int) -> None:
        if self.fail:
            raise ConnectionError("broker down (test)")
        with self.lock:
            self.jobs.append((job, priority))


def make_settings(redis_url: str, model: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": redis_url,
        "models": {model: ModelWindow(max_input_tokens=WINDOW, reserve_output=RESERVE)},
        "retention_s": 3600,
        "summary_queue": f"summaries-test-{uuid.uuid4().hex[:8]}",
        # These tests check behaviour, not the deadline: on a loaded 2-core machine (the suite's
        # workers side by side) a cold cluster client once spent 1.3 s reading the slot map, and
        # an 80-message proxied fit 2.5 s, each past the default 2 s and answered 503.
        # test_deadline.py, test_failover.py and tests/api/proxy/test_upstream.py check the
        # deadline (the default one included) with settings of their own.
        "request_deadline_s": 5.0,
    }
    return Settings(**{**base, **overrides})


def key_of(tenant: str) -> str:
    return f"key-{tenant}-secret"


@pytest.fixture
def model() -> str:
    """A model name no other test uses."""
    return f"model-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(redis_url: str, tenant: str, model: str) -> Settings:
    """Settings whose one API key belongs to the test's unique tenant."""
    return make_settings(redis_url, model, api_keys=f"{tenant}:{key_of(tenant)}")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def app(settings: Settings, store: Store, recorder: Recorder) -> FastAPI:
    return create_app(settings, store=store, enqueue=recorder)


@pytest.fixture
def client(app: FastAPI, tenant: str) -> Iterator[TestClient]:
    """A client authenticated as the test's tenant."""
    headers = {"Authorization": f"Bearer {key_of(tenant)}"}
    with TestClient(app, raise_server_exceptions=False, headers=headers) as c:
        yield c


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A redis-server of this test's own, to freeze or kill (resumed before it is stopped)."""
    require_redis_server()
    proc = RedisProcess().start()
    try:
        yield proc
    finally:
        if proc.pid is not None:
            os.kill(proc.pid, signal.SIGCONT)
        proc.stop()
