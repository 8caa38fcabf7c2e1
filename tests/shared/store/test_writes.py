"""Writes: one script per append or replace; refusals change nothing; the tally goes along."""

from __future__ import annotations

from itertools import accumulate

import pytest

from shared.errors import LengthMismatch
from shared.hashing import EMPTY, prefix_hash, prefix_hashes
from shared.store import Store, keys
from shared.store.writes import Append, Replacement
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.shared.store.helpers import run_threads, tenant_keys


def snapshot(store: Store, tenant: str) -> dict[str, bytes | None]:
    return {k: store.client.dump(k) for k in sorted(tenant_keys(store.client, tenant))}


def tally(store: Store, tenant: str, cid: str) -> list[int]:
    return [int(x) for x in store.client.lrange(keys.conv_tally(tenant, cid), 0, -1)]


def created(store: Store, tenant: str, cid: str = "c") -> list[dict[str, str]]:
    """A conversation of 4 messages with a tally (counter 'k', 10 tokens each), unbound."""
    msgs = numbered_chat(4)
    whole = Replacement(
        msgs, prefix_hashes(msgs), [10, 20, 30, 40], counter="k", bound=False, head_end=1
    )
    store.conversations.writes.replace(tenant, cid, whole)
    return msgs


def test_append_extends_chain_tally_and_metadata_in_one_step(store: Store, tenant: str) -> None:
    """The Lua extends the chain (as `prefix_hashes`), sums the counts and sets the flag."""
    msgs = created(store, tenant)
    new = numbered_chat(2, "n")
    done = store.conversations.writes.append(
        tenant, "c", Append(new, [5, 7], counter="k", free=True, bound=True)
    )
    assert (done.refused, done.old_length, done.length, done.total) == (None, 4, 6, 52)
    assert done.old_hash == prefix_hash(msgs) and done.last_hash == prefix_hash([*msgs, *new])
    assert store.conversations.hashes(tenant, "c") == prefix_hashes([*msgs, *new])
    assert tally(store, tenant, "c") == [10, 20, 30, 40, 45, 52]
    assert store.conversations.meta(tenant, "c").bound is True


def test_refused_appends_change_nothing(store: Store, tenant: str) -> None:
    """A moved tip ('tip'), a bound tip for a free append ('bound') and a wrong length refuse."""
    created(store, tenant)
    writes = store.conversations.writes
    before = snapshot(store, tenant)
    moved = writes.append(tenant, "c", Append(numbered_chat(1, "x"), [1], counter="k", after=EMPTY))
    assert moved.refused == "tip" and moved.length == 4
    with pytest.raises(LengthMismatch):
        writes.append(
            tenant, "c", Append(numbered_chat(1, "x"), [1], counter="k", expected_length=3)
        )
    store.client.hset(keys.conv_meta(tenant, "c"), "bound", "1")
    before = snapshot(store, tenant)
    bound = writes.append(tenant, "c", Append(numbered_chat(1, "x"), [1], counter="k", free=True))
    assert bound.refused == "bound"
    assert snapshot(store, tenant) == before


def test_a_free_append_on_a_missing_conversation_is_refused(store: Store, tenant: str) -> None:
    """Creating is always checked against the empty tip: a free append finds it bound."""
    writes = store.conversations.writes
    assert writes.append(tenant, "new", Append(numbered_chat(1), [1], free=True)).refused == "bound"
    assert tenant_keys(store.client, tenant) == set()
    done = writes.append(
        tenant, "new", Append(numbered_chat(1), [3], counter="k", after=EMPTY, head_end=1)
    )
    assert done.refused is None and done.total == 3


def test_a_tally_of_another_counter_or_tip_is_dropped(store: Store, tenant: str) -> None:
    """An append never extends a tally it cannot vouch for: the reader rebuilds it."""
    created(store, tenant)
    done = store.conversations.writes.append(
        tenant, "c", Append(numbered_chat(1), [1], counter="other")
    )
    assert done.total is None and not done.measured
    assert not store.client.exists(keys.conv_tally(tenant, "c"), keys.conv_tally_info(tenant, "c"))


def test_the_append_measures_when_it_lands_where_viewed(store: Store, tenant: str) -> None:
    """The same call finds the best record within reach and the tally at it and at the head."""
    msgs = created(store, tenant)
    store.records.put(tenant, "c", SummaryRecord(3, prefix_hash(msgs[:3]), "s"))
    plan = Append(numbered_chat(1, "n"), [9], counter="k", free=True, viewed=4, upto_max=4)
    done = store.conversations.writes.append(tenant, "c", plan)
    assert done.measured and done.best is not None and done.best.upto == 3
    assert (done.tokens_upto, done.tokens_head) == (30, 10)
    late = Append(numbered_chat(1, "m"), [9], counter="k", free=True, viewed=4, upto_max=4)
    assert not store.conversations.writes.append(tenant, "c", late).measured  # landed at 5


def test_concurrent_free_appends_all_land_with_a_consistent_tally(
    store: Store, tenant: str
) -> None:
    """Fifty writers at once, none stating a length: all land, and chain and tally agree."""
    created(store, tenant)
    writes = store.conversations.writes

    def write(i: int) -> str | None:
        plan = Append(numbered_chat(2, f"w{i}-"), [i, 1], counter="k", free=True, bound=False)
        return writes.append(tenant, "c", plan).refused

    assert run_threads(write, 50) == [None] * 50
    snap = store.conversations.snapshot(tenant, "c")
    assert len(snap.messages) == 104 and list(snap.hashes) == prefix_hashes(snap.messages)
    sizes = [10, 10, 10, 10] + [
        int(m["content"][1:].split("-")[0]) if m["role"] == "user" else 1 for m in snap.messages[4:]
    ]
    assert tally(store, tenant, "c") == list(accumulate(sizes))


def test_replace_writes_the_tally_and_measures(store: Store, tenant: str) -> None:
    """A replace rebuilds the tally in the same step and answers the best record in reach."""
    msgs = created(store, tenant)
    store.records.put(tenant, "c", SummaryRecord(2, prefix_hash(msgs[:2]), "s"))
    new = [*msgs[:2], *numbered_chat(3, "z")]
    whole = Replacement(
        new, prefix_hashes(new), [1, 2, 3, 4, 5], counter="k", head_end=1, upto_max=4
    )
    done = store.conversations.writes.replace(tenant, "c", whole)
    assert (done.length, done.total, done.measured) == (5, 5, True)
    assert done.best is not None and (done.tokens_upto, done.tokens_head) == (2, 1)
    assert tally(store, tenant, "c") == [1, 2, 3, 4, 5]
