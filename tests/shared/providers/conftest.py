"""Fixtures of the provider tests: one fake provider per module, a recording sleep."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakellm import FakeLLM
from tests.shared.providers.helpers import SleepRecorder


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


@pytest.fixture
def fake(fake_server: FakeLLM) -> FakeLLM:
    """The module's fake provider with no calls, script or delay left from other tests."""
    fake_server.reset()
    return fake_server


@pytest.fixture
def sleeper() -> SleepRecorder:
    return SleepRecorder()
