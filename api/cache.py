"""Conversations kept in the API process, checked against the store on every use.

A stored prepare needs the whole transcript; decoding 128k tokens of JSON per call would
dominate its latency. The cache keeps each conversation's decoded messages, their stored
canonical JSON and their prefix hashes, and every load asks the store (one round trip) for
what follows the cached prefix, verified by hash: an append costs a read of the new
messages, a replace a full reload, and nothing stale is ever served as current. Entries are
never mutated, nor are their messages (a prepare in flight keeps its snapshot; the answer
reuses each message's stored bytes, and the policy recognises the messages it checked by
identity, `frozen`); an update makes a new entry sharing the old one's messages.

`peek` hands out the last snapshot (and the best record seen with it) without asking Redis:
only for an answer marked degraded, when Redis does not answer in time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from api.codec import dumps, loads
from api.views import known_tail_start
from shared.errors import NotFound
from shared.hashing import EMPTY, canonical, extend_chain
from shared.messages import Message
from shared.policy import ContextPolicy
from shared.store.increments import AsyncIncrements, Increment, Increments
from shared.summaries.book import SummaryRecord

MAX_CHARS = 256 * 1024 * 1024  # bytes of stored JSON held, across conversations
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Loaded:
    """A consistent transcript: messages, their canonical JSON, and hashes (len n+1)."""

    messages: list[Message]
    raw: list[bytes]
    hashes: list[str]
    weight: int
    _by_id: dict[int, bytes] = field(default_factory=dict, compare=False, repr=False)
    _regions: dict[tuple[bool, int, frozenset[str]], tuple[int, int]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def length(self) -> int:
        return len(self.messages)

    def extended(
        self, messages: Sequence[Message], raw: Sequence[bytes], hashes: Sequence[str]
    ) -> Loaded:
        return Loaded(
            [*self.messages, *messages],
            [*self.raw, *raw],
            [*self.hashes, *hashes],
            self.weight + sum(map(len, raw)),
        )

    def encoded(self, messages: Sequence[Message]) -> list[bytes]:
        """The JSON of each of `messages`: of each one of ours, unchanged, its stored bytes."""
        if not self._by_id:
            self._by_id.update(zip(map(id, self.messages), self.raw, strict=True))
        stored = self._by_id.get
        return [stored(id(m)) or dumps(m) for m in messages]

    def regions(self, policy: ContextPolicy) -> tuple[int, int]:
        """`policy.regions` of these messages, found once per snapshot: from the last
        messages when they hold the recent turns (`api.views.known_tail_start`), since a snapshot
        extended by a turn is a new one; by a pass over them all otherwise."""
        key = (policy.keep_first_user, policy.keep_recent, policy.preambles)
        found = self._regions.get(key)
        if found is None:
            found = self._regions[key] = snapshot_regions(policy, self.messages)
        return found


EMPTY_LOADED = Loaded([], [], [EMPTY], 0)
RECENT = 256  # messages looked at for the recent turns before a pass over them all


def snapshot_regions(policy: ContextPolicy, messages: list[Message]) -> tuple[int, int]:
    """`policy.regions(messages)`, from their last `RECENT` messages when those hold the
    recent turns and no legacy function result (a stored transcript is a valid one)."""
    head = policy.head(messages).end
    window = messages[-RECENT:]
    if all(m.get("role") != "function" for m in window):  # legacy results join their call
        tail = known_tail_start(window, len(messages) - len(window), head, policy.keep_recent)
        if tail is not None:
            return head, tail
    return policy.regions(messages)


class ConversationCache:
    """An LRU of `Loaded` conversations, bounded by entries and bytes."""

    def __init__(
        self, increments: Increments, *, max_chars: int = MAX_CHARS, max_entries: int = MAX_ENTRIES
    ) -> None:
        self._increments = increments
        self._max_chars = max_chars
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Loaded] = OrderedDict()
        self._best: dict[tuple[str, str], SummaryRecord | None] = {}
        self._chars = 0
        self._lock = threading.Lock()

    def load(self, tenant: str, conv_id: str) -> tuple[Loaded, SummaryRecord | None]:
        """The stored conversation and its best summary record (at any length), reading only
        what the cache lacks, in one round trip; `NotFound` if absent."""
        known = self._get(tenant, conv_id) or EMPTY_LOADED
        inc = self._increments.since(
            tenant, conv_id, start=known.length, prefix_hash=known.hashes[-1]
        )
        if inc.exists and not inc.matches:  # replaced: read it all again
            known = EMPTY_LOADED
            inc = self._increments.since(tenant, conv_id, start=0, prefix_hash=EMPTY)
        return self._apply(tenant, conv_id, known, inc)

    async def aload(
        self, tenant: str, conv_id: str, increments: AsyncIncrements
    ) -> tuple[Loaded, SummaryRecord | None]:
        """`load` on an asyncio Redis client: no thread hop, no blocked event loop."""
        known = self._get(tenant, conv_id) or EMPTY_LOADED
        inc = await increments.since(
            tenant, conv_id, start=known.length, prefix_hash=known.hashes[-1]
        )
        if inc.exists and not inc.matches:
            known = EMPTY_LOADED
            inc = await increments.since(tenant, conv_id, start=0, prefix_hash=EMPTY)
        return self._apply(tenant, conv_id, known, inc)

    def _apply(
        self, tenant: str, conv_id: str, known: Loaded, inc: Increment
    ) -> tuple[Loaded, SummaryRecord | None]:
        if not inc.exists:
            self.drop(tenant, conv_id)
            raise NotFound(f"conversation {conv_id!r} not found")
        if not inc.raw and known.length == inc.length:
            loaded = known
        else:
            loaded = known.extended([loads(r, strict=False) for r in inc.raw], inc.raw, inc.hashes)
            self._put(tenant, conv_id, loaded)
        with self._lock:
            if (tenant, conv_id) in self._entries:
                self._best[(tenant, conv_id)] = inc.best
        return loaded, inc.best

    def shared(self, tenant: str, conv_id: str, messages: list[Message]) -> list[Message]:
        """`messages` with the cached snapshot's own message objects in place of the equal
        ones it starts with (no Redis: an unverified snapshot only lends objects equal by
        content). A client resending its transcript every turn (the proxy's) then hands
        every later step objects it has seen: comparing them to what is stored, counted or
        validated before is an identity check, not a pass over half a megabyte of text."""
        known = self._get(tenant, conv_id)
        if known is None or not 0 < known.length <= len(messages):
            return messages
        if messages[: known.length] != known.messages:
            return messages
        return [*known.messages, *messages[known.length :]]

    def peek(self, tenant: str, conv_id: str) -> tuple[Loaded, SummaryRecord | None] | None:
        """The cached snapshot and the best record last seen with it, unverified (degraded
        answers only); None if the conversation is not cached."""
        with self._lock:
            found = self._entries.get((tenant, conv_id))
            return (found, self._best.get((tenant, conv_id))) if found is not None else None

    def appended(
        self,
        tenant: str,
        conv_id: str,
        *,
        old_length: int,
        old_hash: str,
        messages: Sequence[Message],
    ) -> None:
        """Extend a cached entry by messages just appended after `old_length` (else forget it)."""
        known = self._get(tenant, conv_id)
        if known is None or known.length != old_length or known.hashes[-1] != old_hash:
            return
        raw = [canonical(m) for m in messages]
        self._put(
            tenant, conv_id, known.extended(list(messages), raw, extend_chain(old_hash, messages))
        )

    def drop(self, tenant: str, conv_id: str) -> None:
        with self._lock:
            gone = self._entries.pop((tenant, conv_id), None)
            self._best.pop((tenant, conv_id), None)
            if gone is not None:
                self._chars -= gone.weight

    def _get(self, tenant: str, conv_id: str) -> Loaded | None:
        with self._lock:
            found = self._entries.get((tenant, conv_id))
            if found is not None:
                self._entries.move_to_end((tenant, conv_id))
            return found

    def _put(self, tenant: str, conv_id: str, loaded: Loaded) -> None:
        if loaded.weight > self._max_chars // 2:
            self.drop(tenant, conv_id)
            return
        with self._lock:
            old = self._entries.pop((tenant, conv_id), None)
            if old is not None:
                self._chars -= old.weight
            self._entries[(tenant, conv_id)] = loaded
            self._chars += loaded.weight
            while self._chars > self._max_chars or len(self._entries) > self._max_entries:
                key, evicted = self._entries.popitem(last=False)
                self._best.pop(key, None)
                self._chars -= evicted.weight
