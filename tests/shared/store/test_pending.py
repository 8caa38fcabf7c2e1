"""Pending-job markers: one per conversation state, none from a blocked origin, dropped with
the conversation."""

from __future__ import annotations

from shared.store import Blocks, Range, Store, keys
from shared.store.blocks import origin
from shared.summaries.book import SummaryRecord
from tests.shared.store.helpers import run_threads

RANGE = Range("none", 21, "v1:" + "a" * 32)


def test_a_marker_is_set_once_per_state(store: Store, tenant: str) -> None:
    """Fifty triggers for one (conversation, state) set it once; clearing re-opens it."""
    results = run_threads(lambda i: store.pending.mark(tenant, "c", "upto-40", "none", 60), 50)
    assert results.count(1) == 1 and results.count(0) == 49
    assert store.pending.mark(tenant, "c", "upto-41", "none", 60) == 1
    pttl = store.client.pttl(keys.conv_pending(tenant, "c", "upto-40"))
    assert 0 < pttl <= 60_000
    store.pending.clear(tenant, "c", "upto-40")
    assert store.pending.mark(tenant, "c", "upto-40", "none", 60) == 1


def test_nothing_is_marked_from_a_blocked_origin(store: Store, tenant: str) -> None:
    """A blocked origin refuses the marker; another origin (a record written since) gets it."""
    blocks = Blocks(store.client, base_s=0.3, max_s=1.0)
    blocks.fail(tenant, "c1", RANGE, "E", limit=0, permanent=True)
    assert store.pending.mark(tenant, "c1", "stale-none-3", "none", 15) == -1
    record = SummaryRecord(upto=9, prefix_hash="v1:" + "b" * 32, text="s")
    assert origin(record) == "b" * 32 and origin(None) == "none"
    assert store.pending.mark(tenant, "c1", "stale-bbb-3", origin(record), 15) == 1
    assert store.pending.mark(tenant, "c1", "stale-bbb-3", origin(record), 15) == 0
    assert store.pending.mark(tenant, "c2", "stale-none-3", "none", 15) == 1  # other conv


def test_deleting_the_conversation_drops_its_markers(store: Store, tenant: str) -> None:
    """A conversation deleted and made again under its id gets its summary job at once: the
    old one's markers (up to 120 s) go with it, and only its own."""
    store.conversations.append(tenant, "c1", [{"role": "user", "content": "hi"}])
    assert store.pending.mark(tenant, "c1", "ahead-none-1", "none", 120.0) == 1
    assert store.pending.mark(tenant, "c1", "stale-none-1", "none", 15.0) == 1
    assert store.pending.mark(tenant, "c2", "ahead-none-1", "none", 120.0) == 1
    store.conversations.delete(tenant, "c1")
    assert store.pending.mark(tenant, "c1", "ahead-none-1", "none", 120.0) == 1
    assert store.pending.mark(tenant, "c1", "stale-none-1", "none", 15.0) == 1
    assert store.pending.mark(tenant, "c2", "ahead-none-1", "none", 120.0) == 0
