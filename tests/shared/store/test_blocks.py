"""Failed ranges: one attempt budget per range for every job, a block once it is spent."""

from __future__ import annotations

import time

from shared.hashing import prefix_hashes
from shared.store import Blocks, Range, Store
from tests.builders import numbered_chat
from tests.shared.store.helpers import run_threads

RANGE = Range("none", 21, "v1:" + "a" * 32)
BASE, MAX = 0.3, 1.0


def _blocks(store: Store) -> Blocks:
    return Blocks(store.client, base_s=BASE, max_s=MAX)


def test_the_budget_is_shared_and_the_failure_that_spends_it_blocks(
    store: Store, tenant: str
) -> None:
    """With a limit of 2, failures 1 and 2 retry; the 3rd blocks; later ones find it blocked."""
    blocks = _blocks(store)
    results = [blocks.fail(tenant, "c1", RANGE, "E", limit=2, permanent=False) for _ in range(4)]
    assert [(f.attempts, f.blocked_s) for f in results] == [(1, 0), (2, 0), (3, BASE), (-1, 0)]
    block = blocks.get(tenant, "c1")
    assert block is not None and block.range == RANGE and block.error == "E"
    assert 0 < block.ttl_s <= BASE


def test_a_permanent_failure_blocks_at_once_and_only_once(store: Store, tenant: str) -> None:
    """Twenty jobs failing permanently at once on one range: exactly one of them blocks it."""
    blocks = _blocks(store)
    results = run_threads(
        lambda i: blocks.fail(tenant, "c1", RANGE, "LLMError", limit=5, permanent=True), 20
    )
    assert [f.blocked_s > 0 for f in results].count(True) == 1  # type: ignore[attr-defined]
    assert sorted(f.attempts for f in results)[:19] == [-1] * 19  # type: ignore[attr-defined]


def test_each_new_block_of_a_conversation_lasts_twice_as_long(store: Store, tenant: str) -> None:
    """Blocks of 0.3 s, 0.6 s, then 1 s (the max), as the conversation keeps failing."""
    blocks = _blocks(store)
    pauses = []
    for _ in range(3):
        pauses.append(blocks.fail(tenant, "c1", RANGE, "E", limit=0, permanent=False).blocked_s)
        time.sleep(pauses[-1] + 0.02)
        assert blocks.get(tenant, "c1") is None  # expired: the range may be tried again
    assert pauses == [0.3, 0.6, 1.0]


def test_deleting_the_conversation_lifts_its_block(store: Store, tenant: str) -> None:
    """A conversation deleted and made again under its id is not blocked by the old one's
    dead-lettered range (origin 'none' would otherwise match its first summary too)."""
    blocks = _blocks(store)
    blocks.fail(tenant, "c1", RANGE, "E", limit=0, permanent=True)
    store.conversations.append(tenant, "c1", [{"role": "user", "content": "hi"}])
    assert store.pending.mark(tenant, "c1", "m1", "none", 5.0) == -1
    store.conversations.delete(tenant, "c1")
    assert blocks.get(tenant, "c1") is None
    assert store.pending.mark(tenant, "c1", "m1", "none", 5.0) == 1


def test_replacing_with_unrelated_content_lifts_the_block(store: Store, tenant: str) -> None:
    """A PUT of a transcript that no longer holds the blocked range's prefix lifts the block;
    one that still holds it (an edit after the range) keeps it."""
    blocks = _blocks(store)
    old = numbered_chat(6)
    store.conversations.replace(tenant, "c1", old)
    blocked = Range("none", 4, prefix_hashes(old)[4])
    blocks.fail(tenant, "c1", blocked, "E", limit=0, permanent=True)
    store.conversations.replace(tenant, "c1", [*old[:5], {"role": "user", "content": "edited"}])
    assert blocks.get(tenant, "c1") is not None
    store.conversations.replace(tenant, "c1", numbered_chat(6, "other"))
    assert blocks.get(tenant, "c1") is None
    assert store.pending.mark(tenant, "c1", "m1", "none", 5.0) == 1
