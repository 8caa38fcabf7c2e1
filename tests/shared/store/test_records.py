"""RecordStore against a real Redis: records per conversation, best(), the tenant's directory
of copies (reuse by a fork, cleanup on delete and replace) and isolation between tenants."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError, NotFound
from shared.hashing import prefix_hashes
from shared.store import Store, keys
from shared.summaries.book import SummaryBook, SummaryRecord
from tests.builders import numbered_chat
from tests.shared.store.helpers import run_threads, tenant_keys


def _stored(store: Store, tenant: str, conv: str, n: int, uptos: list[int]) -> list[str]:
    """Store an n-message numbered_chat with one record per upto; return its prefix hashes."""
    msgs = numbered_chat(n)
    store.conversations.append(tenant, conv, msgs)
    h = prefix_hashes(msgs)
    for u in uptos:
        store.records.put(tenant, conv, SummaryRecord(u, h[u], f"summary to {u}"))
    return h


def test_put_once_then_link(store: Store, tenant: str) -> None:
    """The first put writes the record; a second for the same prefix keeps the first."""
    h = _stored(store, tenant, "c", 4, [])
    assert store.records.put(tenant, "c", SummaryRecord(2, h[2], "first"))
    assert not store.records.put(tenant, "c", SummaryRecord(2, h[2], "second"))
    got = store.records.get(tenant, h[2])
    assert got is not None and got.text == "first"
    assert store.records.put(tenant, "c", SummaryRecord(2, h[2], "third"), only_if_absent=False)
    got = store.records.get(tenant, h[2])
    assert got is not None and got.text == "third"


def test_put_for_missing_conversation_is_refused(store: Store, tenant: str) -> None:
    """A put for a conversation that does not exist (e.g. just deleted) stores nothing."""
    h = prefix_hashes(numbered_chat(3))
    with pytest.raises(NotFound):
        store.records.put(tenant, "gone", SummaryRecord(2, h[2], "late"))
    assert tenant_keys(store.client, tenant) == set()


@pytest.mark.parametrize(
    "record",
    [
        SummaryRecord(0, "v1:" + "0" * 32, "t"),
        SummaryRecord(2, "v1:xyz", "t"),
        SummaryRecord(2, "v1:" + "0" * 32 + ":x", "t"),
    ],
)
def test_bad_record_is_refused(store: Store, tenant: str, record: SummaryRecord) -> None:
    """A record with a non-positive upto or a malformed prefix hash never reaches Redis."""
    store.conversations.append(tenant, "c", numbered_chat(3))
    with pytest.raises(ConfigError):
        store.records.put(tenant, "c", record)
    assert store.records.list(tenant, "c") == []


def test_exactly_one_record_under_20_racing_writers(store: Store, tenant: str) -> None:
    """Twenty workers putting the same prefix at once: one wins and its text is what is stored."""
    h = _stored(store, tenant, "c", 6, [])
    results = run_threads(
        lambda i: store.records.put(tenant, "c", SummaryRecord(4, h[4], f"writer {i}")), 20
    )
    winners = [i for i, won in enumerate(results) if won]
    assert len(winners) == 1
    got = store.records.get(tenant, h[4])
    assert got is not None and got.text == f"writer {winners[0]}"
    assert len(store.records.list(tenant, "c")) == 1


def test_best_picks_longest_matching_prefix(store: Store, tenant: str) -> None:
    """With records at 2, 4 and 6 of 8 stored messages, best() returns the one at 6."""
    _stored(store, tenant, "c", 8, [2, 4, 6])
    best = store.records.best(tenant, "c")
    assert best is not None and best.upto == 6
    capped = store.records.best(tenant, "c", upto_max=5)
    assert capped is not None and capped.upto == 4


def test_best_with_given_hashes_of_a_diverging_transcript(store: Store, tenant: str) -> None:
    """Given a transcript that differs from message 5 on, best() stops at the record at 4."""
    _stored(store, tenant, "c", 8, [2, 4, 6])
    other = numbered_chat(8)
    other[5] = {"role": "assistant", "content": "edited"}
    best = store.records.best(tenant, "c", prefix_hashes(other))
    assert best is not None and best.upto == 4
    assert store.records.best(tenant, "c", prefix_hashes(numbered_chat(1))) is None


def test_best_agrees_with_summary_book(store: Store, tenant: str) -> None:
    """The one-round-trip best() finds what SummaryBook.best finds on the same records."""
    _stored(store, tenant, "c", 10, [3, 5, 9])
    transcript = numbered_chat(10)
    transcript[7] = {"role": "assistant", "content": "changed"}
    book = store.records.book(tenant, "c")
    assert isinstance(book, SummaryBook)
    assert store.records.best(tenant, "c", prefix_hashes(transcript)) == book.best(transcript)


def test_best_skips_a_vanished_record(store: Store, tenant: str) -> None:
    """If the longest record's key is gone (expired), best() falls back to the next one."""
    h = _stored(store, tenant, "c", 8, [2, 6])
    store.client.delete(keys.record(tenant, "c", h[6]))
    best = store.records.best(tenant, "c")
    assert best is not None and best.upto == 2


def test_best_after_replace_ignores_records_that_no_longer_match(store: Store, tenant: str) -> None:
    """After replace edits message 3, records past it stop matching and leave the index."""
    h = _stored(store, tenant, "c", 8, [2, 4, 6])
    edited = numbered_chat(8)
    edited[3] = {"role": "assistant", "content": "rewritten"}
    store.conversations.replace(tenant, "c", edited)
    best = store.records.best(tenant, "c")
    assert best is not None and best.upto == 2
    assert [r.upto for r in store.records.list(tenant, "c")] == [2]
    assert store.records.get(tenant, h[4]) is None


def test_list_and_book_are_ordered_by_upto(store: Store, tenant: str) -> None:
    """list() returns the conversation's records lowest upto first; book() holds the same."""
    _stored(store, tenant, "c", 9, [6, 2, 4])
    assert [r.upto for r in store.records.list(tenant, "c")] == [2, 4, 6]
    assert store.records.book(tenant, "c").records == store.records.list(tenant, "c")


def test_a_fork_reuses_a_record_through_the_directory(store: Store, tenant: str) -> None:
    """A second conversation with the same beginning finds the record in the tenant's
    directory and stores its own copy; the entry goes once neither conversation holds it."""
    h = _stored(store, tenant, "a", 6, [4])
    store.conversations.append(tenant, "b", numbered_chat(6))
    found = store.records.get(tenant, h[4])
    assert found is not None and found.text == "summary to 4"
    assert store.records.put(tenant, "b", found)  # b's own copy, in b's slot
    assert store.records.directory.refs(tenant, h[4]) == {"a", "b"}
    store.conversations.delete(tenant, "a")
    best = store.records.best(tenant, "b")
    assert best is not None and best.upto == 4
    assert store.records.get(tenant, h[4]) == found
    assert store.records.directory.refs(tenant, h[4]) == {"b"}
    store.conversations.delete(tenant, "b")
    assert store.records.get(tenant, h[4]) is None
    assert tenant_keys(store.client, tenant) == set()


def test_replace_drops_the_copies_only_its_old_text_had(store: Store, tenant: str) -> None:
    """After a replace edits message 3, the directory loses the copies past it that no other
    conversation holds, and keeps the others."""
    h = _stored(store, tenant, "a", 8, [2, 6])
    _stored(store, tenant, "b", 8, [6])
    edited = numbered_chat(8)
    edited[3] = {"role": "assistant", "content": "rewritten"}
    store.conversations.replace(tenant, "a", edited)
    assert store.records.directory.refs(tenant, h[6]) == {"b"}
    assert store.records.directory.refs(tenant, h[2]) == {"a"}
    store.conversations.replace(tenant, "b", edited)
    assert store.records.get(tenant, h[6]) is None
    assert store.records.get(tenant, h[2]) is not None


def test_a_link_that_lands_after_the_delete_is_taken_back(store: Store, tenant: str) -> None:
    """A copy linked for a conversation that no longer holds the record (deleted between the
    two steps) does not stay in the directory."""
    h = _stored(store, tenant, "a", 6, [4])
    raw = store.client.get(keys.record(tenant, "a", h[4]))
    store.conversations.delete(tenant, "a")
    assert raw is not None
    store.records.publish(tenant, "a", h[4], raw, overwrite=False)  # the worker's late step
    assert store.records.get(tenant, h[4]) is None
    assert tenant_keys(store.client, tenant) == set()


def test_same_content_in_two_tenants_never_shares(store: Store, tenant: str) -> None:
    """Identical transcripts in two tenants: a record of one is invisible to the other."""
    other = tenant + "-b"
    h = _stored(store, tenant, "c", 6, [4])
    store.conversations.append(other, "c", numbered_chat(6))
    assert store.records.get(other, h[4]) is None
    assert store.records.best(other, "c") is None
    assert store.records.best(other, "c", h) is None
    assert keys.directory(tenant, h[4]) != keys.directory(other, h[4])
    assert keys.record(tenant, "c", h[4]) != keys.record(other, "c", h[4])
