"""A store on the suite's Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.settings import Settings
from shared.store import Store

RETENTION_S = 3600


@pytest.fixture
def settings() -> Settings:
    return Settings(retention_s=RETENTION_S)


@pytest.fixture
def store(redis_url: str, settings: Settings) -> Iterator[Store]:
    s = Store.from_url(redis_url, settings)
    try:
        yield s
    finally:
        s.close()
