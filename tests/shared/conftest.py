"""Fixtures of the library's tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for a module's prepares (a new loop per call costs more than they do)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
