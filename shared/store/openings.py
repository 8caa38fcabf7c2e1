"""The tenant's memory of repeated openings: preambles, not tasks.

Which user messages open its conversations as a preamble (a fixed instruction block, a
greeting every session sends) rather than as a task.

The opening of a transcript is the message the transcript-only head rule takes for the task;
its follow-up is the next user message (shared/head.py `opening_pair`). Redis keeps, per tenant
and opening, the follow-up of the first conversation it opened (`keys.opening`: hashes only,
never content; 30 days, renewed on use). A transcript whose follow-up differs is a second
distinct conversation the opening opened: for it the opening is a preamble, and its task is
the follow-up. The first conversation keeps the transcript-only head: a head never flips
under a conversation's feet once the memory learns its opening, so no summary record made
for one head is served under another (records cover `[head_end, upto)` of the head that
made them), and its id (which hashes the head) stays the same. The decision per (opening,
follow-up) never changes while the memory lasts, so it is cached in process.

One command per request at most (a script: read the first follow-up, set it if none, renew
its expiry), none while the decision is cached. Redis faults and answers later than
`TIMEOUT_S` never fail the request: the transcript-only rule stands (the cached decision if
one is known).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from shared.head import opening_pair
from shared.messages import Message
from shared.store import keys

TTL_S = 30 * 86_400
CACHE_S = 600.0  # a decision is asked again after this long (renewing the memory's expiry)
CACHE_ENTRIES = 65_536
TIMEOUT_S = 0.2  # the request never waits longer on the memory

# KEYS[1] the opening; ARGV[1] the follow-up, ARGV[2] the TTL: the first follow-up recorded
FIRST_FOLLOW_UP = """
local first = redis.call('GET', KEYS[1])
if not first then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return ARGV[1]
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return first
"""

AsyncClient = redis.asyncio.Redis | AsyncRedisCluster


def faults() -> tuple[type[BaseException], ...]:
    """What a read of the memory may meet that only means Redis did not answer in time."""
    return (redis.exceptions.RedisError, OSError, asyncio.TimeoutError)


class Openings:
    """The preambles of a transcript by the tenant's memory (one per process)."""

    def __init__(self, *, ttl_s: int = TTL_S, cache_s: float = CACHE_S) -> None:
        self.ttl_s = ttl_s
        self.cache_s = cache_s
        self._known: OrderedDict[tuple[str, str, str], tuple[bool, float]] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, tenant: str, messages: Sequence[Message]) -> frozenset[str]:
        """The preambles of `messages` as this process last learned them (no Redis)."""
        found = opening_pair(messages)
        if found is None:
            return frozenset()
        with self._lock:
            known = self._known.get((tenant, *found))
        return frozenset({found[0]}) if known is not None and known[0] else frozenset()

    async def preambles(
        self, client: AsyncClient, tenant: str, messages: Sequence[Message]
    ) -> frozenset[str]:
        """The `task_digest`s of the openings that are preambles for `messages` (at most
        one), recording its opening in the tenant's memory (see the module docstring)."""
        found = opening_pair(messages)
        if found is None:
            return frozenset()
        entry = (tenant, *found)
        with self._lock:
            known = self._known.get(entry)
        if known is None or known[1] < time.monotonic():
            first = await self._first(client, tenant, *found)
            if first is not None:
                known = (first != found[1], time.monotonic() + self.cache_s)
                self._remember(entry, known)
        return frozenset({found[0]}) if known is not None and known[0] else frozenset()

    async def _first(self, client: AsyncClient, tenant: str, key: str, follow: str) -> str | None:
        """The opening's first follow-up (this one when it is the first), None on a fault."""
        try:
            reply: Any = await asyncio.wait_for(
                client.eval(FIRST_FOLLOW_UP, 1, keys.opening(tenant, key), follow, self.ttl_s),
                TIMEOUT_S,
            )
        except faults():
            return None
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def _remember(self, entry: tuple[str, str, str], known: tuple[bool, float]) -> None:
        with self._lock:
            self._known[entry] = known
            self._known.move_to_end(entry)
            while len(self._known) > CACHE_ENTRIES:
                self._known.popitem(last=False)
