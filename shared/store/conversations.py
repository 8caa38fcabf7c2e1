"""Stored conversations: messages, their prefix-hash chain and metadata, per tenant.

Messages are a Redis LIST of canonical JSON strings (`shared.hashing.canonical`), so an append
is an RPUSH of the new messages only. Beside them a LIST of prefix hashes (element i is the
hash of the first i+1 messages) is extended in O(new) from its last element, so finding the
best summary never rehashes the transcript.

Every write is one Lua script (shared/store/writes.py): an append extends the chain from the
tip it finds, so concurrent appends all land, one after the other, and never race; with
`expected_length` it is refused (changing nothing) unless that is the stored length. Every key
holding user text (messages, hashes, metadata, the summary index and the records it points
at) gets the retention TTL again on every write.

`replace` drops the summary records whose prefix no longer matches the new content. Matching
is by content, so leaving them would be just as correct (they would never match again); they
are dropped so that summaries of replaced text do not outlive it. A delete drops them all.
Either way the tenant's directory of record copies (shared/store/directory.py) follows in a
second step, since it lives in the tenant's slot, not the conversation's.

The store checks only that each message is a JSON object it can encode; validating a
transcript (roles, tool-call pairing) is the caller's job, before it writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.errors import NotFound
from shared.hashing import EMPTY, prefix_hashes
from shared.messages import Message
from shared.store import keys, scripts
from shared.store.client import Client, guarded, guarded_read, text
from shared.store.compression import unpack
from shared.store.directory import Directory
from shared.store.replication import Replication
from shared.store.writes import Append, Replacement, Writes, conv_keys


@dataclass(frozen=True)
class ConversationMeta:
    """What the store knows about a conversation besides its messages (`bound`: the next
    append must be checked against the exact tip, see shared/store/writes.py)."""

    length: int
    created_at: float
    updated_at: float
    model: str | None = None
    bound: bool = True


@dataclass(frozen=True)
class Conversation:
    """A consistent snapshot: messages, their `prefix_hashes` (len n+1) and metadata."""

    messages: list[Message]
    hashes: tuple[str, ...]
    meta: ConversationMeta


class ConversationStore:
    """Conversations of every tenant, on one Redis client."""

    def __init__(
        self,
        client: Client,
        *,
        retention_s: float,
        clock: Callable[[], float] = time.time,
        replication: Replication | None = None,
    ) -> None:
        self._r = client
        self._directory = Directory(client, retention_s=retention_s)
        self.writes = Writes(
            client, self._directory, retention_s=retention_s, clock=clock, replication=replication
        )
        self._delete = client.register_script(scripts.DELETE)

    def append(
        self,
        tenant: str,
        conv_id: str,
        messages: Sequence[Message],
        *,
        expected_length: int | None = None,
        model: str | None = None,
    ) -> int:
        """Append `messages` (creating the conversation) and return the new length.

        With `expected_length`, refuse with `LengthMismatch` (changing nothing) unless the
        stored length equals it. Without it the append always lands, after whatever is stored
        when it runs. A caller that retries after `StoreUnavailable` should state
        `expected_length`: an append whose reply was lost may have landed.
        """
        done = self.writes.append(
            tenant, conv_id, Append(messages, expected_length=expected_length, model=model)
        )
        return done.length

    def replace(
        self,
        tenant: str,
        conv_id: str,
        messages: Sequence[Message],
        *,
        expected_length: int | None = None,
        model: str | None = None,
    ) -> int:
        """Replace the whole conversation (creating it) and return its length."""
        whole = Replacement(
            messages, prefix_hashes(messages), expected_length=expected_length, model=model
        )
        return self.writes.replace(tenant, conv_id, whole).length

    @guarded_read
    def read(self, tenant: str, conv_id: str, *, start: int = 0) -> list[Message]:
        """The stored messages from index `start`; `NotFound` if there is no such conversation."""
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_messages(tenant, conv_id), max(0, start), -1)
        exists, raw = pipe.execute()
        if not exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        return [json.loads(unpack(m)) for m in raw]

    @guarded_read
    def snapshot(self, tenant: str, conv_id: str) -> Conversation:
        """Messages, prefix hashes and metadata read atomically, in one round trip."""
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_messages(tenant, conv_id), 0, -1)
        pipe.lrange(keys.conv_hashes(tenant, conv_id), 0, -1)
        meta, raw, hashes = pipe.execute()
        messages = [json.loads(unpack(m)) for m in raw]
        chain = (EMPTY, *(text(h) for h in hashes))
        return Conversation(messages, chain, meta_of(conv_id, meta, len(messages)))

    @guarded_read
    def hashes(self, tenant: str, conv_id: str) -> list[str]:
        """The stored `prefix_hashes` of the conversation (length n+1)."""
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.lrange(keys.conv_hashes(tenant, conv_id), 0, -1)
        exists, hashes = pipe.execute()
        if not exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        return [EMPTY, *(text(h) for h in hashes)]

    @guarded_read
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

    @guarded_read
    def exists(self, tenant: str, conv_id: str) -> bool:
        return bool(self._r.exists(keys.conv_meta(tenant, conv_id)))

    def delete(self, tenant: str, conv_id: str) -> bool:
        """Delete the conversation and its summary records, then drop it from the tenant's
        directory (the copies only it referred to go).

        The API's token tally goes too, and so do a block of its summaries and its enqueue
        markers (a conversation made again under the id starts unblocked and gets its summary
        jobs at once); a lease just expires.
        """
        existed, dropped = self._delete_now(tenant, conv_id)
        self._directory.drop(tenant, conv_id, dropped)
        return existed

    @guarded
    def _delete_now(self, tenant: str, conv_id: str) -> tuple[bool, list[str]]:
        markers = keys.conv_pending_index(tenant, conv_id)
        extra = [keys.conv_blocked(tenant, conv_id), keys.conv_block_count(tenant, conv_id)]
        ks = [*conv_keys(tenant, conv_id), *extra, markers]
        args = [keys.record_prefix(tenant, conv_id), markers]
        existed, dropped = self._delete(keys=ks, args=args)
        return bool(existed), [text(h) for h in dropped]


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
        bound=f.get("bound") != "0",
    )
