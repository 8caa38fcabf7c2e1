"""Reading only what a reader does not have yet: the messages after a known prefix.

A process that keeps a conversation in memory (the API's cache) knows its first `k` messages
and the prefix hash of them. `since` checks, atomically and in one round trip, that the
stored chain still has that hash at `k` and returns only the messages (as stored, canonical
JSON bytes) and prefix hashes after it. A replaced transcript fails the check and the
reader asks again from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared import keys
from shared.store.chain import EMPTY
from shared.store.client import guarded, text


@dataclass(frozen=True)
class Increment:
    """Stored state past a known prefix of `start` messages.

    `matches` says the stored transcript still begins with the known prefix; only then are
    `raw` (messages start..length-1, canonical JSON) and `hashes` (their prefix hashes,
    element i the hash of the first start+i+1 messages) meaningful.
    """

    exists: bool
    length: int
    start: int
    matches: bool
    raw: list[bytes]
    hashes: list[str]


class Increments:
    """Incremental reads of every tenant's conversations, on one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self._r = client

    @guarded
    def since(self, tenant: str, conv_id: str, *, start: int, prefix_hash: str) -> Increment:
        """Messages and hashes after the first `start`, if those still hash to `prefix_hash`."""
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
        exists, length, at_start, raw, chain = pipe.execute()
        length = int(length)
        matches = (
            bool(exists)
            and start <= length
            and at_start is not None
            and text(at_start) == prefix_hash
        )
        return Increment(
            exists=bool(exists),
            length=length,
            start=start,
            matches=matches,
            raw=list(raw) if matches else [],
            hashes=[text(h) for h in chain] if matches else [],
        )
