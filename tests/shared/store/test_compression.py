"""Messages stored compressed: both formats read, chained on their JSON, a fixed dictionary."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from shared.errors import StoreFormatUnknown
from shared.hashing import EMPTY, canonical, prefix_hashes
from shared.store import Store, keys
from shared.store.compression import FORMAT, JSON, dictionary_path, pack, unpack
from shared.store.increments import Increments
from tests.builders import numbered_chat
from tests.conftest import load_transcript, needs_transcripts, transcript_files
from tests.shared.store.helpers import run_threads

# Stored messages are decompressed with this file for as long as any of them exists: it may
# never change (a new dictionary is a new file and format byte, shared/store/compression.py).
DICTIONARY_1_SHA256 = "e92aa87d891e248b0cdefec59911978df8e262bffc79af1250145d8c31e63ee6"


def agent_messages() -> list[dict[str, Any]]:
    path = next(p for p in transcript_files() if p.name.startswith("mswea"))
    messages: list[dict[str, Any]] = load_transcript(path)["messages"]
    return messages


def stored(store: Store, tenant: str, conv_id: str) -> list[bytes]:
    return list(store.client.lrange(keys.conv_messages(tenant, conv_id), 0, -1))


def test_the_shipped_dictionary_is_the_one_messages_were_written_with() -> None:
    """Dictionary 1's bytes are pinned: rewriting it would make every stored message unreadable."""
    data = dictionary_path(FORMAT).read_bytes()
    assert hashlib.sha256(data).hexdigest() == DICTIONARY_1_SHA256


@needs_transcripts
def test_agent_messages_round_trip_and_shrink() -> None:
    """Every message of a real agent transcript comes back byte for byte, in well under half
    its JSON (the ratio itself is measured in bench/store_memory.py)."""
    raw = [canonical(m) for m in agent_messages()]
    packed = [pack(r) for r in raw]
    assert [unpack(p) for p in packed] == raw
    assert sum(map(len, packed)) < 0.5 * sum(map(len, raw))
    assert any(p[0] == FORMAT for p in packed)


def test_a_message_compression_would_not_shorten_stays_json() -> None:
    """A message too short to gain is stored as its canonical JSON, which reads back as it is;
    the dictionary shortens even a one-word chat message."""
    raw = canonical({"x": "y"})
    assert pack(raw) == raw
    assert unpack(raw) == raw
    hello = canonical({"role": "user", "content": "hi"})
    assert len(pack(hello)) < len(hello)


def test_an_unknown_format_or_a_damaged_frame_is_refused() -> None:
    """A format byte no dictionary has (a newer prefit's) and a frame that does not decompress
    raise `StoreFormatUnknown`, never return wrong text."""
    with pytest.raises(StoreFormatUnknown, match="format 9"):
        unpack(b"\x09" + pack(canonical({"role": "user", "content": "x" * 200}))[1:])
    with pytest.raises(StoreFormatUnknown, match="does not decompress"):
        unpack(bytes([FORMAT]) + b"not a zstd frame at all")


def test_packing_from_many_threads_at_once() -> None:
    """Each thread packs and unpacks with its own zstd objects: no thread sees another's data."""
    texts = [canonical({"role": "tool", "content": f"output {i} " * (50 + i)}) for i in range(8)]

    def one(i: int) -> bool:
        return all(unpack(pack(texts[i])) == texts[i] for _ in range(200))

    assert run_threads(one, len(texts)) == [True] * len(texts)


def test_stored_elements_are_compressed_and_chained_on_their_json(
    store: Store, tenant: str
) -> None:
    """An append stores the long messages compressed, one element each, and the prefix chain
    is still that of their canonical JSON."""
    msgs = [*numbered_chat(3), {"role": "user", "content": "def f(x):\n    return x\n" * 40}]
    store.conversations.append(tenant, "c", msgs)
    elements = stored(store, tenant, "c")
    assert len(elements) == len(msgs)
    assert elements[-1][0] == FORMAT
    assert len(elements[-1]) < len(canonical(msgs[-1])) / 4
    assert [unpack(e) for e in elements] == [canonical(m) for m in msgs]
    assert store.conversations.hashes(tenant, "c") == prefix_hashes(msgs)


def test_a_conversation_written_before_compression_reads_and_grows(
    store: Store, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys in the old format (plain canonical JSON elements, as the writer before compression
    left them) read through every reader; appends after them are compressed, and the chain and
    every read cover both."""
    long = {"role": "tool", "tool_call_id": "call_1", "content": "line of output\n" * 60}
    call = {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1")]}
    old = [*numbered_chat(3), call, long]
    with monkeypatch.context() as m:
        m.setattr("shared.store.writes.pack", lambda raw: raw)  # the writer before compression
        store.conversations.append(tenant, "c", old)
    assert all(e[0] == JSON for e in stored(store, tenant, "c"))
    new = [{"role": "user", "content": "and now? " * 30}]
    store.conversations.append(tenant, "c", new)
    whole = [*old, *new]
    assert [e[0] for e in stored(store, tenant, "c")][-2:] == [JSON, FORMAT]
    assert store.conversations.read(tenant, "c") == whole
    snap = store.conversations.snapshot(tenant, "c")
    assert (snap.messages, list(snap.hashes)) == (whole, prefix_hashes(whole))
    since = Increments(store.client).since(tenant, "c", start=0, prefix_hash=EMPTY)
    assert since.raw == [canonical(m) for m in whole]
    assert [json.loads(r) for r in since.raw] == whole
    claim = store.claims.claim(tenant, "c", "worker-1", 5.0)
    assert claim.conversation is not None and claim.conversation.messages == whole


def tool_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}


def test_unreadable_stored_message_fails_the_read(store: Store, tenant: str) -> None:
    """A conversation holding an element of an unknown format is refused on read, typed."""
    store.conversations.append(tenant, "c", numbered_chat(2))
    store.client.rpush(keys.conv_messages(tenant, "c"), b"\x2a" + b"x" * 30)
    with pytest.raises(StoreFormatUnknown):
        store.conversations.read(tenant, "c")
