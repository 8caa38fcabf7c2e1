"""UsageStore: per-tenant counters."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.store import Store, Usage
from tests.shared.store.helpers import run_threads


def test_new_tenant_has_zero_usage(store: Store, tenant: str) -> None:
    """A tenant that never summarized reads all zeros."""
    assert store.usage.get(tenant) == Usage()


def test_add_accumulates(store: Store, tenant: str) -> None:
    """Each add increases tokens, cost and the summary count."""
    store.usage.add(tenant, 100, 20, 0.5)
    store.usage.add(tenant, 50, 10, 0.25, summaries=2)
    assert store.usage.get(tenant) == Usage(150, 30, 0.75, 3)  # binary-exact amounts


def test_concurrent_adds_lose_nothing(store: Store, tenant: str) -> None:
    """Twenty threads adding at once give exact totals."""
    run_threads(lambda i: store.usage.add(tenant, 10, 1, 0.125), 20)
    assert store.usage.get(tenant) == Usage(200, 20, 2.5, 20)


def test_tenants_are_counted_apart(store: Store, tenant: str) -> None:
    """One tenant's usage never shows in another's."""
    store.usage.add(tenant, 10, 1, 0.1)
    assert store.usage.get(tenant + "-b") == Usage()


@pytest.mark.parametrize("args", [(-1, 0, 0.0), (0, 1.5, 0.0), (0, 0, -0.1), (0, 0, float("inf"))])
def test_bad_amounts_are_refused(store: Store, tenant: str, args: tuple[int, int, float]) -> None:
    """Negative, fractional or infinite amounts raise ConfigError and change nothing."""
    with pytest.raises(ConfigError):
        store.usage.add(tenant, *args)
    assert store.usage.get(tenant) == Usage()
