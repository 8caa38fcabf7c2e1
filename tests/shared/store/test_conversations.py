"""ConversationStore against a real Redis."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidId, InvalidTranscript, LengthMismatch, NotFound
from shared.hashing import canonical, prefix_hashes
from shared.store import Store, keys
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.conftest import RETENTION_S, load_transcript, needs_transcripts, transcript_files
from tests.shared.store.helpers import run_threads, tenant_keys


def test_append_creates_and_read_round_trips(store: Store, tenant: str) -> None:
    """Appending creates the conversation; reading returns equal messages and the length."""
    msgs = numbered_chat(5)
    assert store.conversations.append(tenant, "c1", msgs[:2], expected_length=0) == 2
    assert store.conversations.append(tenant, "c1", msgs[2:], expected_length=2) == 5
    assert store.conversations.read(tenant, "c1") == msgs
    assert store.conversations.read(tenant, "c1", start=3) == msgs[3:]
    assert store.conversations.length(tenant, "c1") == 5
    assert store.conversations.exists(tenant, "c1")


def test_append_sends_and_stores_only_the_new_messages(store: Store, tenant: str) -> None:
    """An append after 200 messages ships one message's worth of data and RPUSHes one element."""
    base = numbered_chat(200)
    store.conversations.append(tenant, "c", base)
    sent: list[int] = []
    client: Any = store.client
    original = client.execute_command

    def spy(*args: Any, **kwargs: Any) -> Any:
        sent.append(sum(len(a) for a in args if isinstance(a, bytes | str)))
        return original(*args, **kwargs)

    client.execute_command = spy
    try:
        new = {"role": "user", "content": "x" * 500}
        assert store.conversations.append(tenant, "c", [new]) == 201
    finally:
        del client.execute_command
    assert max(sent) < 3 * len(canonical(new)) + 1000
    assert store.client.llen(keys.conv_messages(tenant, "c")) == 201
    assert store.client.llen(keys.conv_hashes(tenant, "c")) == 201


def test_stored_chain_equals_prefix_hashes(store: Store, tenant: str) -> None:
    """The chain extended append by append equals `prefix_hashes` of the whole transcript."""
    msgs = numbered_chat(9)
    for i in range(0, 9, 4):
        store.conversations.append(tenant, "c", msgs[i : i + 4])
    assert store.conversations.hashes(tenant, "c") == prefix_hashes(msgs)
    snap = store.conversations.snapshot(tenant, "c")
    assert list(snap.hashes) == prefix_hashes(msgs)
    assert snap.messages == msgs
    assert snap.meta.length == 9


def test_expected_length_mismatch_changes_nothing(store: Store, tenant: str) -> None:
    """A stale expected_length is refused with both lengths, leaving every key as it was."""
    store.conversations.append(tenant, "c", numbered_chat(3), model="m1")
    before = {k: store.client.dump(k) for k in tenant_keys(store.client, tenant)}
    with pytest.raises(LengthMismatch) as err:
        store.conversations.append(
            tenant, "c", numbered_chat(2, "new"), expected_length=2, model="m2"
        )
    assert (err.value.expected, err.value.actual) == (2, 3)
    after = {k: store.client.dump(k) for k in tenant_keys(store.client, tenant)}
    assert after == before


def test_expected_length_zero_refuses_existing_conversation(store: Store, tenant: str) -> None:
    """expected_length=0 creates a new conversation but is refused once it exists."""
    store.conversations.append(tenant, "c", numbered_chat(1), expected_length=0)
    with pytest.raises(LengthMismatch):
        store.conversations.append(tenant, "c", numbered_chat(1), expected_length=0)


def test_racing_appends_with_same_expected_length_one_wins(store: Store, tenant: str) -> None:
    """Ten writers stating the same expected length: exactly one append lands."""
    store.conversations.append(tenant, "c", numbered_chat(2))
    results: list[str] = []

    def write(i: int) -> None:
        try:
            store.conversations.append(tenant, "c", numbered_chat(1, f"w{i}-"), expected_length=2)
            results.append("ok")
        except LengthMismatch:
            results.append("refused")

    run_threads(write, 10)
    assert sorted(results) == ["ok"] + ["refused"] * 9
    assert store.conversations.length(tenant, "c") == 3


def test_racing_appends_without_expected_length_keep_chain_consistent(
    store: Store, tenant: str
) -> None:
    """Concurrent blind appends all land, and the hash chain matches the final messages."""
    run_threads(lambda i: store.conversations.append(tenant, "c", numbered_chat(3, f"w{i}-")), 10)
    snap = store.conversations.snapshot(tenant, "c")
    assert len(snap.messages) == 30
    assert list(snap.hashes) == prefix_hashes(snap.messages)


@pytest.mark.parametrize(
    "bad, index",
    [([{"role": "user", "content": "ok"}, "not a dict"], 1), ([{"role": "user", "x": {1, 2}}], 0)],
)
def test_bad_message_is_refused_and_nothing_stored(
    store: Store, tenant: str, bad: list[Any], index: int
) -> None:
    """A message that is not a JSON object names its index and stores nothing."""
    with pytest.raises(InvalidTranscript) as err:
        store.conversations.append(tenant, "c", bad)
    assert err.value.index == index
    assert not store.conversations.exists(tenant, "c")
    assert tenant_keys(store.client, tenant) == set()


@pytest.mark.parametrize("conv_id", ["", "a:b", "{x}", "a b", "x" * 129, "é"])
def test_bad_conversation_id_is_refused(store: Store, tenant: str, conv_id: str) -> None:
    """Ids that could collide or move the hash tag are refused before anything is written."""
    with pytest.raises(InvalidId):
        store.conversations.append(tenant, conv_id, numbered_chat(1))
    assert tenant_keys(store.client, tenant) == set()


def test_missing_conversation_is_not_found(store: Store, tenant: str) -> None:
    """Reading, measuring or hashing an unknown conversation raises NotFound."""
    for call in (
        store.conversations.read,
        store.conversations.length,
        store.conversations.meta,
        store.conversations.hashes,
        store.conversations.snapshot,
    ):
        with pytest.raises(NotFound):
            call(tenant, "nope")
    assert not store.conversations.exists(tenant, "nope")


def test_empty_conversation_exists_with_length_zero(store: Store, tenant: str) -> None:
    """Replacing with no messages leaves an existing, empty conversation."""
    assert store.conversations.replace(tenant, "c", []) == 0
    assert store.conversations.read(tenant, "c") == []
    assert store.conversations.length(tenant, "c") == 0


def test_replace_rewrites_messages_and_chain(store: Store, tenant: str) -> None:
    """Replace swaps the content and rebuilds the chain; a stale expected_length is refused."""
    store.conversations.append(tenant, "c", numbered_chat(6))
    new = numbered_chat(4, "r")
    assert store.conversations.replace(tenant, "c", new, expected_length=6) == 4
    assert store.conversations.read(tenant, "c") == new
    assert store.conversations.hashes(tenant, "c") == prefix_hashes(new)
    with pytest.raises(LengthMismatch):
        store.conversations.replace(tenant, "c", numbered_chat(2), expected_length=6)
    assert store.conversations.read(tenant, "c") == new


def test_metadata_keeps_model_and_times_and_an_unchecked_append_binds_the_tip(
    store: Store, tenant: str
) -> None:
    """The model sticks until another is given; the store's own append marks the tip bound."""
    store.conversations.append(tenant, "c", numbered_chat(2), model="gpt-x")
    meta = store.conversations.meta(tenant, "c")
    assert (meta.model, meta.length, meta.bound) == ("gpt-x", 2, True)
    store.conversations.append(tenant, "c", numbered_chat(1, "z"))
    later = store.conversations.meta(tenant, "c")
    assert later.model == "gpt-x" and later.updated_at >= meta.updated_at
    assert later.created_at == meta.created_at


def test_delete_removes_every_key(store: Store, tenant: str) -> None:
    """Delete removes messages, chain, metadata, tally, summary index, its records and their
    copies in the tenant's directory that only it referred to."""
    msgs = numbered_chat(6)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)
    store.records.put(tenant, "c", SummaryRecord(4, h[4], "summary"))
    store.client.rpush(keys.conv_tally(tenant, "c"), 10, 20)  # the API's token tally
    store.client.hset(keys.conv_tally_info(tenant, "c"), "counter", "x")
    assert len(tenant_keys(store.client, tenant)) == 9  # 7 of the conversation, 2 of the copy
    assert store.conversations.delete(tenant, "c")
    assert tenant_keys(store.client, tenant) == set()
    assert not store.conversations.delete(tenant, "c")


def test_tenants_are_isolated(store: Store, tenant: str) -> None:
    """The same conversation id in two tenants holds two independent conversations."""
    other = tenant + "-b"
    store.conversations.append(tenant, "c", numbered_chat(2))
    store.conversations.append(other, "c", numbered_chat(3, "o"))
    assert store.conversations.read(tenant, "c") == numbered_chat(2)
    store.conversations.delete(other, "c")
    assert store.conversations.read(tenant, "c") == numbered_chat(2)


def test_retention_ttl_on_every_user_text_key_refreshed_on_write(store: Store, tenant: str) -> None:
    """Each key holding the conversation's text (records too) gets the retention TTL on write;
    the record's copy in the tenant's directory got it when it was copied."""
    msgs = numbered_chat(4)
    store.conversations.append(tenant, "c", msgs)
    h = prefix_hashes(msgs)[2]
    store.records.put(tenant, "c", SummaryRecord(2, h, "s"))
    copies = {keys.directory(tenant, h), keys.directory_refs(tenant, h)}
    found = tenant_keys(store.client, tenant) - copies
    assert found == {
        keys.conv_messages(tenant, "c"),
        keys.conv_hashes(tenant, "c"),
        keys.conv_meta(tenant, "c"),
        keys.conv_index(tenant, "c"),
        keys.record(tenant, "c", h),
    }
    for key in copies:
        assert RETENTION_S * 1000 - 60_000 < store.client.pttl(key) <= RETENTION_S * 1000, key
    for key in found:
        store.client.pexpire(key, 5000)
    store.conversations.append(tenant, "c", numbered_chat(1, "n"))
    for key in found:
        assert RETENTION_S * 1000 - 60_000 < store.client.pttl(key) <= RETENTION_S * 1000, key


@needs_transcripts
def test_real_transcripts_round_trip_with_their_chain(store: Store, tenant: str) -> None:
    """Every real transcript, appended in chunks, reads back equal with the same prefix hashes."""
    for i, path in enumerate(transcript_files()):
        msgs = load_transcript(path)["messages"]
        conv = f"real-{i}"
        for start in range(0, len(msgs), 17):
            store.conversations.append(
                tenant, conv, msgs[start : start + 17], expected_length=start
            )
        snap = store.conversations.snapshot(tenant, conv)
        assert snap.messages == msgs, path.name
        assert list(snap.hashes) == prefix_hashes(msgs), path.name
