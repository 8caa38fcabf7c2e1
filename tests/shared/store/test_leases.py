"""Leases: exclusive, owner-only renew/release, background renewal."""

from __future__ import annotations

import time

import pytest

from shared.errors import LeaseLost
from shared.store import Lease, Store, keys
from tests.shared.store.helpers import run_threads


def _wait_for(predicate: object, timeout: float = 5.0) -> bool:
    """Poll until predicate() is true (condition waits, not timing assertions)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_one_holder_at_a_time(store: Store, tenant: str) -> None:
    """A second worker cannot acquire a held lease; after release it can."""
    assert store.leases.acquire(tenant, "c", "w1", 30)
    assert not store.leases.acquire(tenant, "c", "w2", 30)
    assert store.leases.owner(tenant, "c") == "w1"
    assert store.leases.release(tenant, "c", "w1")
    assert store.leases.acquire(tenant, "c", "w2", 30)


def test_only_one_of_20_racing_workers_acquires(store: Store, tenant: str) -> None:
    """Twenty workers racing for one conversation: exactly one gets the lease."""
    results = run_threads(lambda i: store.leases.acquire(tenant, "c", f"w{i}", 30), 20)
    assert results.count(True) == 1
    assert store.leases.owner(tenant, "c") == f"w{results.index(True)}"


def test_late_duplicate_cannot_renew_or_release(store: Store, tenant: str) -> None:
    """After w1's lease expired and w2 took it, w1 can neither extend nor delete w2's lease."""
    assert store.leases.acquire(tenant, "c", "w1", 30)
    store.client.delete(keys.conv_lease(tenant, "c"))  # as if it expired
    assert store.leases.acquire(tenant, "c", "w2", 30)
    assert not store.leases.renew(tenant, "c", "w1", 30)
    assert not store.leases.release(tenant, "c", "w1")
    assert store.leases.owner(tenant, "c") == "w2"


def test_renew_extends_the_ttl(store: Store, tenant: str) -> None:
    """The owner's renew sets the TTL anew."""
    key = keys.conv_lease(tenant, "c")
    assert store.leases.acquire(tenant, "c", "w1", 1)
    assert store.leases.renew(tenant, "c", "w1", 60)
    assert 1000 < store.client.pttl(key) <= 60_000


def test_held_lease_is_renewed_in_background(store: Store, tenant: str) -> None:
    """A lease held past several TTLs stays ours because the thread keeps renewing it."""
    key = keys.conv_lease(tenant, "c")
    held = store.leases.hold(tenant, "c", "w1", 0.6)
    assert held is not None
    with held:
        assert store.leases.hold(tenant, "c", "w2", 0.6) is None
        time.sleep(1.5)
        held.check()
        assert store.leases.owner(tenant, "c") == "w1"
    assert not store.client.exists(key)  # released on exit


def test_held_lease_reports_loss(store: Store, tenant: str) -> None:
    """When another worker takes over, check() raises LeaseLost and exit leaves its lease alone."""
    held = store.leases.hold(tenant, "c", "w1", 0.6)
    assert held is not None
    with held:
        store.client.delete(keys.conv_lease(tenant, "c"))
        assert store.leases.acquire(tenant, "c", "w2", 30)
        assert _wait_for(lambda: held.lost)
        with pytest.raises(LeaseLost):
            held.check()
    assert store.leases.owner(tenant, "c") == "w2"


def test_held_lease_counts_as_lost_once_ttl_passes_unrenewed(store: Store, tenant: str) -> None:
    """With no successful renewal for a whole TTL (Redis unreachable), check() raises."""
    now = [1000.0]
    leases = Lease(store.client, clock=lambda: now[0])
    held = leases.hold(tenant, "c", "w1", 60)
    assert held is not None
    held.check()
    now[0] += 61
    with pytest.raises(LeaseLost):
        held.check()
    held.close()
