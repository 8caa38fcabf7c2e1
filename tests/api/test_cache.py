"""The process cache of conversations and of calibration ratios: bounded, never stale."""

from __future__ import annotations

import pytest

from api.cache import ConversationCache, snapshot_regions
from api.ratios import CachedRatios
from shared.errors import NotFound, StoreUnavailable
from shared.policy import ContextPolicy
from shared.store import Store
from shared.store.increments import Increments
from tests.api.helpers import conv_id
from tests.builders import chat, user
from tests.conftest import load_transcript, needs_transcripts, transcript_files


def test_cache_reads_only_new_messages_and_reloads_replaced_ones(store: Store, tenant: str) -> None:
    """A cached conversation is extended by what was appended, reloaded when replaced."""
    cache = ConversationCache(Increments(store.client))
    cid = conv_id()
    store.conversations.append(tenant, cid, chat(2))
    first, best = cache.load(tenant, cid)
    assert first.messages == chat(2) and cache.load(tenant, cid)[0] is first and best is None
    store.conversations.append(tenant, cid, [user("more")])
    second, _ = cache.load(tenant, cid)
    assert second.messages == [*chat(2), user("more")] and second.messages[0] is first.messages[0]
    assert second.hashes == store.conversations.hashes(tenant, cid)
    store.conversations.replace(
        tenant, cid, [user("other"), user("x"), user("y"), user("z"), user("w"), user("v")]
    )
    assert cache.load(tenant, cid)[0].messages[0] == user("other")
    store.conversations.delete(tenant, cid)
    with pytest.raises(NotFound):
        cache.load(tenant, cid)


def test_cache_is_bounded_by_bytes(store: Store, tenant: str) -> None:
    """Entries beyond the byte budget are evicted, least recently used first."""
    cache = ConversationCache(Increments(store.client), max_chars=20_000)
    ids = [conv_id() for _ in range(5)]
    for cid in ids:
        store.conversations.append(tenant, cid, chat(4, size=1000))
        cache.load(tenant, cid)
    assert cache._chars <= 20_000 and ids[-1] in {c for _, c in cache._entries}
    assert ids[0] not in {c for _, c in cache._entries}


class Flaky:
    """Ratios per (tenant, model) in memory, that can be taken down."""

    def __init__(self) -> None:
        self.down = False
        self.values: dict[tuple[str, str | None], float] = {}

    def get(self, tenant: str, model: str | None) -> float | None:
        if self.down:
            raise StoreUnavailable("down")
        return self.values.get((tenant, model))

    def observe(self, tenant: str, model: str | None, observed: float) -> float:
        self.values[(tenant, model)] = observed
        return observed


def test_ratios_are_read_once_per_ttl_and_remembered_for_degraded_answers() -> None:
    """Reads are cached for the TTL per tenant; with the store down the last ratio is known."""
    now = [0.0]
    inner = Flaky()
    inner.observe("a", "m", 2.0)
    inner.observe("b", "m", 1.5)
    ratios = CachedRatios(inner, ttl=1.0, clock=lambda: now[0])
    assert ratios.get("a", "m") == 2.0 and ratios.fresh("a", "m")
    assert not ratios.fresh("b", "m") and ratios.get("b", "m") == 1.5
    inner.observe("a", "m", 1.0)
    assert ratios.get("a", "m") == 2.0  # cached
    now[0] = 1.5
    assert ratios.get("a", "m") == 1.0
    inner.down = True
    now[0] = 3.0
    with pytest.raises(StoreUnavailable):
        ratios.get("a", "m")
    assert ratios.last_known("a", "m") == 1.0 and ratios.last_known("c", "m") is None


def test_a_resent_transcript_borrows_the_cached_message_objects(store: Store, tenant: str) -> None:
    """A transcript starting with the cached one gets the cache's objects for that part (so
    later comparisons are identity checks); one that differs anywhere is left as it is."""
    cache = ConversationCache(Increments(store.client))
    cid = conv_id()
    store.conversations.append(tenant, cid, chat(2))
    cached, _ = cache.load(tenant, cid)
    resent = [dict(m) for m in chat(2)] + [user("new")]
    got = cache.shared(tenant, cid, resent)
    assert got == resent and got[-1] is resent[-1]
    assert all(a is b for a, b in zip(got, cached.messages, strict=False))
    edited = [dict(m) for m in chat(2)]
    edited[1]["content"] = "edited"
    for other in (edited, chat(2)[:2], [user("x")] * 6):
        assert cache.shared(tenant, cid, other) is other
    assert cache.shared(tenant, conv_id(), resent) is resent  # not cached


@needs_transcripts
@pytest.mark.parametrize("keep_recent", [1, 3])
def test_a_snapshots_regions_from_its_last_messages_are_the_policys(keep_recent: int) -> None:
    """The head and recent tail found from the last messages equal a pass over them all."""
    policy = ContextPolicy(1_000_000, keep_recent=keep_recent)
    for path in transcript_files()[::3]:
        msgs = load_transcript(path)["messages"]
        for n in range(1, len(msgs) + 1, 5):
            assert snapshot_regions(policy, msgs[:n]) == policy.regions(msgs[:n]), (path.name, n)
