"""Fixtures of the worker tests: a fake LLM over real HTTP, a model name, Celery apps."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared.settings import Settings
from shared.summaries.summarizers import Summarizer
from tests.fakellm import FakeLLM
from tests.worker.helpers import model_name
from worker.app import make_app
from worker.runtime import Runtime


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as f:
        yield f


@pytest.fixture
def model() -> str:
    return model_name()


@pytest.fixture
def app_for() -> Iterator[Callable[..., Any]]:
    """Makes Celery apps of their own runtime; closes the runtimes (loop, client, store) after."""
    runtimes: list[Runtime] = []

    def make(settings: Settings, summarizer: Summarizer | None = None) -> Any:
        runtime = Runtime(settings, summarizer=summarizer)
        runtimes.append(runtime)
        runtime.check_store()  # as `prefit worker` does at start-up (and so builds its store)
        return make_app(settings, runtime=runtime, main=f"test-{uuid.uuid4().hex[:6]}")

    yield make
    for runtime in runtimes:
        runtime.close()
