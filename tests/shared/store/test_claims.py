"""Claims: a summary job's merged round trips do what the separate calls did."""

from __future__ import annotations

import threading

import pytest

from shared.errors import NotFound
from shared.hashing import prefix_hashes
from shared.store import Store, keys
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat


def test_claim_takes_the_lease_and_reads_under_it(store: Store, tenant: str) -> None:
    """With the lease come the messages, hashes, metadata, book and the tenant's ratio."""
    msgs = numbered_chat(6)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)
    store.records.put(tenant, "c", SummaryRecord(2, h[2], "to 2"))
    store.ratios.observe(tenant, "m", 1.5)
    store.ratios.observe(f"{tenant}-other", "m", 2.5)
    claim = store.claims.claim(tenant, "c", "w1", 30, ratio_of="m")
    assert claim.held is not None and claim.holder is None
    assert store.leases.owner(tenant, "c") == "w1"
    conv = claim.conversation
    assert conv is not None
    assert conv.messages == store.conversations.read(tenant, "c")
    assert conv.hashes == store.conversations.snapshot(tenant, "c").hashes
    assert conv.meta == store.conversations.meta(tenant, "c")
    assert claim.book is not None and [r.upto for r in claim.book.records] == [2]
    assert claim.ratio == store.ratios.get(tenant, "m") == 1.5
    claim.held.close()
    assert store.leases.owner(tenant, "c") is None


def test_claim_of_a_held_lease_names_the_holder(store: Store, tenant: str) -> None:
    store.conversations.append(tenant, "c", numbered_chat(4))
    assert store.leases.acquire(tenant, "c", "w1", 30)
    claim = store.claims.claim(tenant, "c", "w2", 30, ratio_of="m")
    assert claim.held is None and claim.holder == "w1"
    assert claim.conversation is None and claim.book is None
    assert store.leases.owner(tenant, "c") == "w1"


def test_claim_of_a_missing_conversation(store: Store, tenant: str) -> None:
    """The lease is taken (and must be released); there is nothing to read."""
    claim = store.claims.claim(tenant, "gone", "w1", 30)
    assert claim.held is not None
    assert claim.conversation is None and claim.ratio is None
    claim.held.close()
    assert store.leases.owner(tenant, "gone") is None


def test_commit_counts_then_writes_once(store: Store, tenant: str) -> None:
    msgs = numbered_chat(4)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)
    assert store.claims.commit(tenant, "c", SummaryRecord(2, h[2], "first"), (100, 10, 0.25))
    assert not store.claims.commit(tenant, "c", SummaryRecord(2, h[2], "second"), (50, 5, 0.5))
    got = store.records.get(tenant, h[2])
    assert got is not None and got.text == "first"
    assert [r.upto for r in store.records.list(tenant, "c")] == [2]
    usage = store.usage.get(tenant)
    assert (usage.input_tokens, usage.output_tokens, usage.summaries) == (150, 15, 2)
    assert usage.cost == pytest.approx(0.75)


def test_commit_for_a_deleted_conversation_counts_but_writes_nothing(
    store: Store, tenant: str
) -> None:
    h = prefix_hashes(numbered_chat(3))
    with pytest.raises(NotFound):
        store.claims.commit(tenant, "c", SummaryRecord(2, h[2], "x"), (7, 1, 0.0))
    assert store.records.get(tenant, h[2]) is None
    assert store.usage.get(tenant).input_tokens == 7


def test_release_gives_up_the_lease_then_reads_the_metadata(store: Store, tenant: str) -> None:
    store.conversations.append(tenant, "c", numbered_chat(4))
    claim = store.claims.claim(tenant, "c", "w1", 30)
    assert claim.held is not None and claim.conversation is not None
    with claim.held:
        store.conversations.append(tenant, "c", numbered_chat(2))
        now = store.claims.release(claim.held)
        assert store.leases.owner(tenant, "c") is None
        # another worker takes the lease; leaving the block must not release it
        assert store.leases.acquire(tenant, "c", "w2", 30)
    assert store.leases.owner(tenant, "c") == "w2"
    assert now is not None and now.length == 6
    assert now.updated_at >= claim.conversation.meta.updated_at


def test_release_of_a_deleted_conversation(store: Store, tenant: str) -> None:
    store.conversations.append(tenant, "c", numbered_chat(2))
    claim = store.claims.claim(tenant, "c", "w1", 30)
    assert claim.held is not None
    store.conversations.delete(tenant, "c")
    assert store.claims.release(claim.held) is None
    assert not store.client.exists(keys.conv_lease(tenant, "c"))


def test_held_leases_share_one_renewal_thread(store: Store, tenant: str) -> None:
    """Holding many leases does not start a thread each."""
    before = threading.active_count()
    held = [store.leases.hold(tenant, f"c{i}", "w", 30) for i in range(20)]
    for lease in held:
        assert lease is not None
        lease.__enter__()
    assert threading.active_count() <= before + 1
    for lease in held:
        assert lease is not None
        lease.close()
    assert not any(store.leases.owner(tenant, f"c{i}") for i in range(20))
