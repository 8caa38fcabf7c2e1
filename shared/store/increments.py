"""Reading only what a reader does not have yet: the messages after a known prefix.

A process that keeps a conversation in memory (the API's cache) knows its first `k` messages
and the prefix hash of them. `since` checks, atomically and in one round trip, that the
stored chain still has that hash at `k` and returns only the messages (as stored, canonical
JSON bytes) and prefix hashes after it, together with the conversation's best summary
record (the store's own `records.BEST`, run inside the same script). A replaced transcript
fails the check and the reader asks again from 0.

It is one script rather than a MULTI of six commands: the stored prepare makes this read on
every call, and packing, queueing and parsing six commands cost the API process more CPU
than the script does.

`AsyncIncrements` is the same read on a `redis.asyncio` client, for an event loop that must
not block on Redis nor pay a thread hop on its hottest path.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from shared.hashing import EMPTY
from shared.store import keys
from shared.store.client import Client, guarded_read, guarded_read_async, text
from shared.store.compression import unpack_all
from shared.store.records import BEST
from shared.summaries.book import SummaryRecord

# KEYS: meta, messages, hashes, record index. ARGV: start, the empty chain's hash, the
# caller's prefix hash at start, record prefix. Returns exists, length, the stored hash at
# start, the messages and hashes after it (none unless that hash is the caller's), and the
# best record (`records.BEST`, in a function of its own).
SINCE = (
    "local function best(KEYS, ARGV)\n"
    + BEST
    + """
end
local start = tonumber(ARGV[1])
local exists = redis.call('EXISTS', KEYS[1])
local length = redis.call('LLEN', KEYS[2])
local at_start = ARGV[2]
if start > 0 then at_start = redis.call('LINDEX', KEYS[3], start - 1) end
local raw, chain = {}, {}
if exists == 1 and at_start == ARGV[3] then
  raw = redis.call('LRANGE', KEYS[2], start, -1)
  chain = redis.call('LRANGE', KEYS[3], start, -1)
end
return {exists, length, at_start, raw, chain, best({KEYS[4], KEYS[3]}, {ARGV[4], '+inf', 'stored'})}
"""
)


@dataclass(frozen=True)
class Increment:
    """Stored state past a known prefix of `start` messages.

    `matches` says the stored transcript still begins with the known prefix; only then are
    `raw` (messages start..length-1, canonical JSON) and `hashes` (their prefix hashes,
    element i the hash of the first start+i+1 messages) meaningful. `best` is the record
    covering the longest matching prefix of the stored transcript, at any length.
    """

    exists: bool
    length: int
    start: int
    matches: bool
    raw: list[bytes]
    hashes: list[str]
    best: SummaryRecord | None = None


class Increments:
    """Incremental reads of every tenant's conversations, on one Redis client."""

    def __init__(self, client: Client) -> None:
        self._r = client
        self._sha = _sha1(SINCE)

    @guarded_read
    def since(self, tenant: str, conv_id: str, *, start: int, prefix_hash: str) -> Increment:
        """Messages, hashes and best record after the first `start`, if those still match."""
        try:
            return self._since(tenant, conv_id, start, prefix_hash)
        except redis.exceptions.NoScriptError:  # first use, or a restarted Redis
            self._r.script_load(SINCE)
            return self._since(tenant, conv_id, start, prefix_hash)

    def _since(self, tenant: str, conv_id: str, start: int, prefix_hash: str) -> Increment:
        reply = self._r.evalsha(self._sha, 4, *_arguments(tenant, conv_id, start, prefix_hash))
        return _increment(start, prefix_hash, *reply)


class AsyncIncrements:
    """`Increments.since` on an asyncio Redis client (bound to the loop that first uses it)."""

    def __init__(self, client: redis.asyncio.Redis | AsyncRedisCluster) -> None:
        self._r = client
        self._sha = _sha1(SINCE)

    @property
    def client(self) -> redis.asyncio.Redis | AsyncRedisCluster:
        """The asyncio client it reads with (other short reads of the loop share it)."""
        return self._r

    async def aclose(self) -> None:
        await self._r.aclose()

    async def since(self, tenant: str, conv_id: str, *, start: int, prefix_hash: str) -> Increment:
        """As `Increments.since`; Redis faults and timeouts become `StoreUnavailable` (on a
        cluster, after retries within the request's deadline)."""

        async def read() -> Increment:
            try:
                return await self._since(tenant, conv_id, start, prefix_hash)
            except redis.exceptions.NoScriptError:  # first use, or a restarted Redis
                await self._r.script_load(SINCE)
                return await self._since(tenant, conv_id, start, prefix_hash)

        return await guarded_read_async(read, self._r)

    async def _since(self, tenant: str, conv_id: str, start: int, prefix_hash: str) -> Increment:
        args = _arguments(tenant, conv_id, start, prefix_hash)
        reply = await self._r.evalsha(self._sha, 4, *args)
        return _increment(start, prefix_hash, *reply)


def _arguments(tenant: str, conv_id: str, start: int, prefix_hash: str) -> list[Any]:
    """The keys and arguments of `SINCE`."""
    return [
        keys.conv_meta(tenant, conv_id),
        keys.conv_messages(tenant, conv_id),
        keys.conv_hashes(tenant, conv_id),
        keys.conv_index(tenant, conv_id),
        start,
        EMPTY,
        prefix_hash,
        keys.record_prefix(tenant, conv_id),
    ]


def _increment(
    start: int,
    prefix_hash: str,
    exists: Any,
    length: Any,
    at_start: Any,
    raw: Any,
    chain: Any,
    best: Any,
) -> Increment:
    length = int(length)
    matches = (
        bool(exists) and start <= length and at_start is not None and text(at_start) == prefix_hash
    )
    return Increment(
        exists=bool(exists),
        length=length,
        start=start,
        matches=matches,
        raw=unpack_all(raw) if matches else [],
        hashes=[text(h) for h in chain] if matches else [],
        best=_record(best) if best is not None else None,
    )


@functools.lru_cache(maxsize=1024)
def _record(raw: bytes) -> SummaryRecord:
    """A stored record's value: every read returns the best record again, parsed once here
    (records are frozen, so one parsed value serves every reader of the same bytes)."""
    return SummaryRecord.from_json(raw)


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()
