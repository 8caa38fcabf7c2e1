"""Prefix hashes, version 2: pinned vectors, and the Lua chain step equal to Python's."""

from __future__ import annotations

import hashlib

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidTranscript
from shared.hashing import (
    EMPTY,
    chain_step,
    extend_chain,
    message_digest,
    prefix_hash,
    prefix_hashes,
)
from shared.store.scripts import CHAIN

PINNED = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi — ünïcode"},
]


def test_known_vectors_never_change_silently() -> None:
    """The persisted hashes of a fixed transcript are pinned: changing them needs a version."""
    assert hashlib.sha1(b"prefit-prefix-v2").hexdigest()[:32] == EMPTY.removeprefix("v2:")
    assert EMPTY == "v2:ef4cb2084216d303683414be1774dcb0"
    assert message_digest(PINNED[0]) == "484b0dac5fa5fb2005ed87e696e530d8"
    assert prefix_hashes(PINNED) == [
        "v2:ef4cb2084216d303683414be1774dcb0",
        "v2:f9778999f76f9817bec0c50c7b17212a",
        "v2:8d3f3e17118720643bf9abf93eb096d7",
    ]
    assert prefix_hash(PINNED) == prefix_hashes(PINNED)[-1]


def test_the_step_is_sha1_of_the_previous_hash_and_the_digest() -> None:
    """h(k+1) = 'v2:' + sha1(h(k) + digest)[:32], on the text of both."""
    digest = message_digest(PINNED[0])
    expected = "v2:" + hashlib.sha1((EMPTY + digest).encode()).hexdigest()[:32]
    assert chain_step(EMPTY, digest) == expected == prefix_hashes(PINNED)[1]
    assert extend_chain(EMPTY, PINNED) == prefix_hashes(PINNED)[1:]


LUA = (
    CHAIN
    + """
local out, h = {}, ARGV[1]
for i = 2, #ARGV do
  h = chain_step(h, ARGV[i])
  out[#out + 1] = h
end
return out
"""
)

contents = st.lists(st.text(max_size=30), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(contents)
def test_lua_chain_equals_python(redis_url: str, texts: list[str]) -> None:
    """Redis's Lua step (as the append script runs it) gives exactly `prefix_hashes`."""
    msgs = [{"role": "user", "content": t} for t in texts]
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.eval(LUA, 0, EMPTY, *(message_digest(m) for m in msgs))
    finally:
        client.close()
    assert [h.decode() for h in raw] == prefix_hashes(msgs)[1:]


def test_a_message_without_canonical_encoding_is_a_typed_error() -> None:
    """A lone surrogate (JSON's `\\ud800` escape) or a non-JSON value raises
    InvalidTranscript with its index, as the store refuses it, not UnicodeEncodeError."""
    ok = {"role": "user", "content": "fine"}
    for bad in ({"role": "user", "content": "cut emoji \ud83d"}, {"role": "user", "content": {1}}):
        with pytest.raises(InvalidTranscript) as exc:
            prefix_hashes([ok, bad])
        assert exc.value.index == 1
        with pytest.raises(InvalidTranscript):
            prefix_hash([ok, bad])
