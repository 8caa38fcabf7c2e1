"""The in-flight registry: entries ride with the lease, and only expired ones are reaped, once."""

from __future__ import annotations

import time
import uuid

from shared.store import Store, Ticket
from tests.builders import numbered_chat
from tests.shared.store.helpers import run_threads


def _ticket(tenant: str, conv: str = "c1", retries: int = 0) -> Ticket:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    kwargs = {"tenant": tenant, "conversation_id": conv, "length": 3}
    return Ticket(f"task-{uuid.uuid4().hex[:8]}", queue, kwargs, retries)


def test_an_entry_lives_from_claim_to_release(store: Store, tenant: str) -> None:
    """Claiming registers the job, the lease's release removes it: a finished job is not reaped."""
    store.conversations.append(tenant, "c1", numbered_chat(3))
    ticket = _ticket(tenant)
    claim = store.claims.claim(tenant, "c1", "w1", 0.05, ticket=ticket)
    assert claim.held is not None and store.inflight.running(ticket.queue) == 1
    store.claims.release(claim.held)
    time.sleep(0.1)  # past the deadline it would have had
    assert store.inflight.running(ticket.queue) == 0
    assert store.inflight.reap(ticket.queue) == []


def test_an_entry_nobody_renews_is_reaped_once_its_deadline_passed(
    store: Store, tenant: str
) -> None:
    """A dead worker's entry comes back (kwargs and retries intact) after its ttl, not before."""
    store.conversations.append(tenant, "c1", numbered_chat(3))
    ticket = _ticket(tenant, retries=2)
    claim = store.claims.claim(tenant, "c1", "w1", 0.3, ticket=ticket)
    assert claim.held is not None  # and never released nor renewed: the worker died
    assert store.inflight.reap(ticket.queue) == []
    time.sleep(0.35)
    assert store.inflight.reap(ticket.queue) == [ticket]
    assert store.inflight.reap(ticket.queue) == []  # taken: no second reaper gets it


def test_renewing_the_lease_pushes_the_entry_back(store: Store, tenant: str) -> None:
    """A live worker's renewals keep its entry from being reaped."""
    ticket = _ticket(tenant)
    assert store.leases.acquire(tenant, "c1", "w1", 0.3)
    store.inflight.register(ticket, 0.3)
    for _ in range(3):
        time.sleep(0.15)
        assert store.leases.renew(tenant, "c1", "w1", 0.3, ticket)
    assert store.inflight.reap(ticket.queue) == []


def test_a_renewal_does_not_bring_back_a_removed_entry(store: Store, tenant: str) -> None:
    """A renewal landing after the entry was removed (job over, or reaped) adds nothing."""
    ticket = _ticket(tenant)
    assert store.leases.acquire(tenant, "c1", "w1", 5)
    store.inflight.register(ticket, 5)
    store.inflight.leave(ticket)
    assert store.leases.renew(tenant, "c1", "w1", 5, ticket)
    assert store.inflight.running(ticket.queue) == 0


def test_a_deferred_retry_is_due_after_its_countdown_as_the_next_retry(
    store: Store, tenant: str
) -> None:
    """A retry waiting out a countdown is reaped only after countdown + ttl, retries counted."""
    ticket = _ticket(tenant, retries=1)
    store.inflight.defer(ticket, 0.2, 0.1)
    time.sleep(0.15)
    assert store.inflight.reap(ticket.queue) == []
    time.sleep(0.25)
    (reaped,) = store.inflight.reap(ticket.queue)
    assert reaped.task_id == ticket.task_id and reaped.retries == 2


def test_racing_reapers_share_expired_entries_without_overlap(store: Store, tenant: str) -> None:
    """Eight reapers at once over 40 expired entries: each entry goes to exactly one."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    tickets = [Ticket(f"t{i}", queue, {"tenant": tenant}, 0) for i in range(40)]
    for t in tickets:
        store.inflight.register(t, 0.01)
    time.sleep(0.05)
    batches = run_threads(lambda i: store.inflight.reap(queue, limit=7), 8)
    taken = [t.task_id for batch in batches for t in batch]  # type: ignore[attr-defined]
    assert sorted(taken) == sorted(t.task_id for t in tickets)  # all 40, none twice
    assert store.inflight.reap(queue) == []
