"""Reading only what a reader does not have yet: the messages after a known prefix.

A process that keeps a conversation in memory (the API's cache) knows its first `k` messages
and the prefix hash of them. `since` checks, atomically and in one round trip, that the
stored chain still has that hash at `k` and returns only the messages (as stored, canonical
JSON bytes) and prefix hashes after it, together with the conversation's best summary
record (the store's own `records.BEST` script, in the same transaction). A replaced
transcript fails the check and the reader asks again from 0.

`AsyncIncrements` is the same read on a `redis.asyncio` client, for an event loop that must
not block on Redis nor pay a thread hop on its hottest path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from shared import keys
from shared.errors import StoreUnavailable
from shared.store.chain import EMPTY
from shared.store.client import guarded, text
from shared.store.records import BEST
from shared.summaries import SummaryRecord


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

    def __init__(self, client: redis.Redis) -> None:
        self._r = client
        self._best = client.register_script(BEST)

    @guarded
    def since(self, tenant: str, conv_id: str, *, start: int, prefix_hash: str) -> Increment:
        """Messages, hashes and best record after the first `start`, if those still match."""
        try:
            return self._since(tenant, conv_id, start, prefix_hash)
        except redis.exceptions.NoScriptError:  # a restarted Redis forgot the script
            self._r.script_load(BEST)
            return self._since(tenant, conv_id, start, prefix_hash)

    def _since(self, tenant: str, conv_id: str, start: int, prefix_hash: str) -> Increment:
        msgs, hashes = keys.conv_messages(tenant, conv_id), keys.conv_hashes(tenant, conv_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.llen(msgs)
        if start > 0:
            pipe.lindex(hashes, start - 1)
        else:
            pipe.echo(EMPTY)
        pipe.lrange(msgs, start, -1)
        pipe.lrange(hashes, start, -1)
        best_keys = [keys.conv_index(tenant, conv_id), hashes]
        args: list[Any] = [keys.record_prefix(tenant), "+inf", "stored"]
        pipe.evalsha(self._best.sha, len(best_keys), *best_keys, *args)
        exists, length, at_start, raw, chain, best = pipe.execute()
        return _increment(start, prefix_hash, exists, length, at_start, raw, chain, best)


class AsyncIncrements:
    """`Increments.since` on an asyncio Redis client (bound to the loop that first uses it)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._r = client
        self._sha = _sha1(BEST)

    async def aclose(self) -> None:
        await self._r.aclose()

    async def since(self, tenant: str, conv_id: str, *, start: int, prefix_hash: str) -> Increment:
        """As `Increments.since`; Redis faults and timeouts become `StoreUnavailable`."""
        try:
            try:
                return await self._since(tenant, conv_id, start, prefix_hash)
            except redis.exceptions.NoScriptError:  # first use, or a restarted Redis
                await self._r.script_load(BEST)
                return await self._since(tenant, conv_id, start, prefix_hash)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise StoreUnavailable(f"redis unavailable: {type(exc).__name__}") from exc

    async def _since(self, tenant: str, conv_id: str, start: int, prefix_hash: str) -> Increment:
        msgs, hashes = keys.conv_messages(tenant, conv_id), keys.conv_hashes(tenant, conv_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.llen(msgs)
        if start > 0:
            pipe.lindex(hashes, start - 1)
        else:
            pipe.echo(EMPTY)
        pipe.lrange(msgs, start, -1)
        pipe.lrange(hashes, start, -1)
        best_keys = [keys.conv_index(tenant, conv_id), hashes]
        args: list[Any] = [keys.record_prefix(tenant), "+inf", "stored"]
        pipe.evalsha(self._sha, len(best_keys), *best_keys, *args)
        exists, length, at_start, raw, chain, best = await pipe.execute()
        return _increment(start, prefix_hash, exists, length, at_start, raw, chain, best)


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
        raw=list(raw) if matches else [],
        hashes=[text(h) for h in chain] if matches else [],
        best=SummaryRecord.from_json(best) if best is not None else None,
    )


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()
