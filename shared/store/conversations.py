"""Stored conversations: messages, their prefix-hash chain and metadata, per tenant.

Messages are a Redis LIST of canonical JSON strings (`shared.hashing.canonical`), so an append
is an RPUSH of the new messages only. Beside them a LIST of prefix hashes (element i is the
hash of the first i+1 messages) is extended in O(new) from its last element, so finding the
best summary never rehashes the transcript.

Writes are compare-and-set in Lua on (length, last prefix hash): a concurrent writer makes the
script refuse instead of interleaving. Every key holding user text (messages, hashes,
metadata, the summary index and the records it points at) gets the retention TTL again on
every write.

`replace` unlinks the summary records whose prefix no longer matches the new content. Matching
is by content, so leaving them would be just as correct (they would never match again); they
are dropped so that summaries of replaced text do not outlive it.

The store checks only that each message is a JSON object it can encode; validating a
transcript (roles, tool-call pairing) is the caller's job, before it writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from shared import keys
from shared.errors import (
    ConfigError,
    InvalidTranscript,
    LengthMismatch,
    NotFound,
    StoreUnavailable,
)
from shared.hashing import canonical
from shared.messages import Message
from shared.store import scripts
from shared.store.chain import EMPTY, extend_chain
from shared.store.client import guarded, text, ttl_ms

MAX_ATTEMPTS = 16  # compare-and-set retries of an append that stated no expected length


@dataclass(frozen=True)
class ConversationMeta:
    """What the store knows about a conversation besides its messages.

    `tokens` is a token count the API cached for the first `tokens_upto` messages; it is
    current only while `tokens_upto == length` (see `tokens_current`).
    """

    length: int
    created_at: float
    updated_at: float
    model: str | None = None
    tokens: int | None = None
    tokens_upto: int = 0

    @property
    def tokens_current(self) -> bool:
        return self.tokens is not None and self.tokens_upto == self.length


@dataclass(frozen=True)
class Conversation:
    """A consistent snapshot: messages, their `prefix_hashes` (len n+1) and metadata."""

    messages: list[Message]
    hashes: tuple[str, ...]
    meta: ConversationMeta


class ConversationStore:
    """Conversations of every tenant, on one Redis client."""

    def __init__(
        self, client: redis.Redis, *, retention_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._clock = clock
        self._append = client.register_script(scripts.APPEND)
        self._replace = client.register_script(scripts.REPLACE)
        self._delete = client.register_script(scripts.DELETE)
        self._set_tokens = client.register_script(scripts.SET_TOKENS)

    @guarded
    def append(
        self,
        tenant: str,
        conv_id: str,
        messages: Sequence[Message],
        *,
        expected_length: int | None = None,
        model: str | None = None,
        tokens: int | None = None,
    ) -> int:
        """Append `messages` (creating the conversation) and return the new length.

        With `expected_length`, refuse with `LengthMismatch` (changing nothing) unless the
        stored length equals it. `tokens`, if given, is cached as the count of the whole
        conversation after this append. A caller that retries after `StoreUnavailable` should
        state `expected_length`: an append whose reply was lost may have landed.
        """
        encoded = _encode(messages)
        ks = _conv_keys(tenant, conv_id)
        for _ in range(MAX_ATTEMPTS):
            length, last = self._tip(ks)
            if expected_length is not None and length != expected_length:
                raise LengthMismatch(expected_length, length)
            chain = extend_chain(last or EMPTY, messages)
            args = [length, last, *self._common(tenant, model, tokens), len(messages)]
            ok, now_len = self._append(keys=ks, args=[*args, *encoded, *chain])
            if ok:
                return int(now_len)
        raise StoreUnavailable(f"append kept racing other writers ({MAX_ATTEMPTS} attempts)")

    @guarded
    def replace(
        self,
        tenant: str,
        conv_id: str,
        messages: Sequence[Message],
        *,
        expected_length: int | None = None,
        model: str | None = None,
        tokens: int | None = None,
    ) -> int:
        """Replace the whole conversation (creating it) and return its length."""
        encoded = _encode(messages)
        chain = extend_chain(EMPTY, messages)
        expected = "" if expected_length is None else expected_length
        args = [expected, conv_id, *self._common(tenant, model, tokens), len(messages)]
        ok, length = self._replace(keys=_conv_keys(tenant, conv_id), args=[*args, *encoded, *chain])
        if not ok:
            raise LengthMismatch(int(expected), int(length))
        return int(length)

    @guarded
    def read(self, tenant: str, conv_id: str, *, start: int = 0) -> list[Message]:
        """The stored messages from index `start`; `NotFound` if there is no such conversation."""
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_messages(tenant, conv_id), max(0, start), -1)
        exists, raw = pipe.execute()
        if not exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        return [json.loads(m) for m in raw]

    @guarded
    def snapshot(self, tenant: str, conv_id: str) -> Conversation:
        """Messages, prefix hashes and metadata read atomically, in one round trip."""
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_messages(tenant, conv_id), 0, -1)
        pipe.lrange(keys.conv_hashes(tenant, conv_id), 0, -1)
        meta, raw, hashes = pipe.execute()
        messages = [json.loads(m) for m in raw]
        chain = (EMPTY, *(text(h) for h in hashes))
        return Conversation(messages, chain, meta_of(conv_id, meta, len(messages)))

    @guarded
    def hashes(self, tenant: str, conv_id: str) -> list[str]:
        """The stored `prefix_hashes` of the conversation (length n+1)."""
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_hashes(tenant, conv_id), 0, -1)
        exists, hashes = pipe.execute()
        if not exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        return [EMPTY, *(text(h) for h in hashes)]

    @guarded
    def meta(self, tenant: str, conv_id: str) -> ConversationMeta:
        """The conversation's metadata and length; `NotFound` if it does not exist."""
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(keys.conv_meta(tenant, conv_id))
        pipe.llen(keys.conv_messages(tenant, conv_id))
        meta, length = pipe.execute()
        return meta_of(conv_id, meta, int(length))

    def length(self, tenant: str, conv_id: str) -> int:
        """Number of stored messages; `NotFound` if the conversation does not exist."""
        return self.meta(tenant, conv_id).length

    @guarded
    def exists(self, tenant: str, conv_id: str) -> bool:
        return bool(self._r.exists(keys.conv_meta(tenant, conv_id)))

    @guarded
    def set_tokens(self, tenant: str, conv_id: str, tokens: int, *, upto: int) -> bool:
        """Cache a token count of the first `upto` messages, only if that is still the length."""
        ks = [keys.conv_messages(tenant, conv_id), keys.conv_meta(tenant, conv_id)]
        return bool(self._set_tokens(keys=ks, args=[_count(tokens, "tokens"), upto]))

    @guarded
    def delete(self, tenant: str, conv_id: str) -> bool:
        """Delete the conversation, its summary index and the records only it pointed at.

        The API's token tally goes too; an enqueue marker or lease just expires.
        """
        args = [conv_id, keys.record_prefix(tenant), keys.REFS_SUFFIX]
        extra = [keys.conv_tally(tenant, conv_id), keys.conv_tally_info(tenant, conv_id)]
        return bool(self._delete(keys=[*_conv_keys(tenant, conv_id), *extra], args=args))

    def _tip(self, ks: list[str]) -> tuple[int, str]:
        pipe = self._r.pipeline(transaction=True)
        pipe.llen(ks[0])
        pipe.lindex(ks[1], -1)
        length, last = pipe.execute()
        return int(length), text(last) if last is not None else ""

    def _common(self, tenant: str, model: str | None, tokens: int | None) -> list[Any]:
        count = "" if tokens is None else _count(tokens, "tokens")
        return [
            self._ttl,
            repr(self._clock()),
            model or "",
            count,
            keys.record_prefix(tenant),
            keys.REFS_SUFFIX,
        ]


def _conv_keys(tenant: str, conv_id: str) -> list[str]:
    return [
        keys.conv_messages(tenant, conv_id),
        keys.conv_hashes(tenant, conv_id),
        keys.conv_meta(tenant, conv_id),
        keys.conv_index(tenant, conv_id),
    ]


def _encode(messages: Sequence[Message]) -> list[bytes]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidTranscript("messages must be a list of message objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidTranscript(f"message must be an object, got {type(m).__name__}", i)
        try:
            out.append(canonical(m))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidTranscript(f"message is not JSON-encodable: {exc}", i) from None
    return out


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def meta_of(conv_id: str, raw: dict[bytes, bytes], length: int) -> ConversationMeta:
    """Metadata from a HGETALL reply; `NotFound` if it is empty (no such conversation)."""
    if not raw:
        raise NotFound(f"conversation {conv_id!r} not found")
    f = {text(k): text(v) for k, v in raw.items()}
    return ConversationMeta(
        length=length,
        created_at=float(f.get("created_at", 0.0)),
        updated_at=float(f.get("updated_at", 0.0)),
        model=f.get("model"),
        tokens=int(f["tokens"]) if "tokens" in f else None,
        tokens_upto=int(f.get("tokens_upto", 0)),
    )
