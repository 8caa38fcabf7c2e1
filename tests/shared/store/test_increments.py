"""Incremental reads against a real Redis: what follows a known prefix, checked by its hash."""

from __future__ import annotations

import pytest

from shared.hashing import EMPTY, canonical, prefix_hashes
from shared.store import Store
from shared.store.increments import AsyncIncrements, Increment, Increments
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.redisbackend import async_store_client

pytestmark = pytest.mark.anyio


def test_only_what_follows_a_matching_prefix_is_read(store: Store, tenant: str) -> None:
    """From a prefix whose hash still matches: the messages after it, their hashes, the best
    record; from a prefix that no longer matches, or past the end, nothing."""
    msgs = numbered_chat(6)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)
    store.records.put(tenant, "c", SummaryRecord(2, h[2], "to 2"))
    since = Increments(store.client).since
    got = since(tenant, "c", start=4, prefix_hash=h[4])
    assert (got.exists, got.length, got.matches) == (True, 6, True)
    assert got.raw == [canonical(m) for m in msgs[4:]] and got.hashes == h[5:]
    assert got.best is not None and got.best.text == "to 2"
    whole = since(tenant, "c", start=0, prefix_hash=EMPTY)
    assert whole.matches and len(whole.raw) == 6 and whole.hashes == h[1:]
    for start, prefix in ((4, h[3]), (7, h[6]), (6, h[6])):
        other = since(tenant, "c", start=start, prefix_hash=prefix)
        assert other.raw == [] and other.hashes == [] and other.length == 6
        assert other.matches == (start == 6)  # at the end, a match with nothing new
    missing = since(tenant, "nobody", start=0, prefix_hash=EMPTY)
    assert (missing.exists, missing.length, missing.matches, missing.best) == (
        False,
        0,
        False,
        None,
    )


async def test_the_asyncio_read_is_the_same_read(store: Store, tenant: str, redis_url: str) -> None:
    """`AsyncIncrements` answers exactly as `Increments`."""
    msgs = numbered_chat(5)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)
    store.records.put(tenant, "c", SummaryRecord(2, h[2], "to 2"))

    async def read(start: int, prefix: str) -> Increment:
        reader = AsyncIncrements(async_store_client(redis_url))
        try:
            return await reader.since(tenant, "c", start=start, prefix_hash=prefix)
        finally:
            await reader.aclose()

    for start, prefix in ((0, EMPTY), (3, h[3]), (3, h[2])):
        expected = Increments(store.client).since(tenant, "c", start=start, prefix_hash=prefix)
        assert await read(start, prefix) == expected
