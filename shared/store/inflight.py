"""The summary jobs running now, so that a job whose worker died is sent again within a minute.

The broker hands a lost job out again only after its visibility timeout (an hour by default),
and only on brokers that have one. Here every running job has an entry: its task id in a ZSET
scored by its lease deadline (ms, Redis's clock), and what resending it takes in a HASH. The
entry is written in the same round trip as the conversation's lease (`Claims.claim`), pushed
back with every lease renewal, removed with the lease's release at the end of a round
(`Claims.release`), and pushed back by the countdown when the task retries. A worker killed
mid-summary renews nothing more: once the deadline has passed, a reaper (every worker runs one)
takes the entry, atomically so only one reaper does, and enqueues the job again. Recovery takes
about the lease ttl plus the reaper's interval, whatever the broker. The broker may still hand
the old message out later: a duplicate, which the lease and the records' SET NX make harmless.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.store import keys
from shared.store.client import Client, eval_in, guarded, guarded_read, text, ttl_ms

# The time in ms on Redis's clock, so every worker and reaper compares with the same clock.
NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: deadlines, jobs. ARGV: task id, ms until the deadline, job JSON.
REGISTER = (
    NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""
)

# KEYS: deadlines, jobs. ARGV: task id, ttl ms. Only an entry still registered is pushed back.
RENEW = (
    NOW
    + """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# KEYS: deadlines, jobs. ARGV: task id.
UNREGISTER = """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
"""

# KEYS: deadlines, jobs. ARGV: at most this many. The entries past their deadline, removed:
# {id, job JSON, id, job JSON, ...}.
REAP = (
    NOW
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(ids) do
  local job = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  if job then
    out[#out + 1] = id
    out[#out + 1] = job
  end
end
return out
"""
)


@dataclass(frozen=True)
class Ticket:
    """A running job's entry: its task, the queue it came from, and how often it was retried."""

    task_id: str
    queue: str
    kwargs: Mapping[str, Any]
    retries: int = 0

    @functools.cached_property
    def payload(self) -> str:
        """What the registry keeps of it (made once: each claim of the job writes it)."""
        return json.dumps({"kwargs": dict(self.kwargs), "retries": self.retries})

    def registry(self) -> list[str]:
        """The keys of its queue's registry: deadlines, jobs."""
        return [keys.inflight_deadlines(self.queue), keys.inflight_jobs(self.queue)]


class InFlight:
    """The in-flight registries of every queue, on one Redis client."""

    def __init__(self, client: Client) -> None:
        self._r = client

    # pipelined with the lease (claims.py, leases.py): no round trip of their own

    @staticmethod
    def register_in(pipe: Any, ticket: Ticket, ttl: float) -> None:
        eval_in(pipe, REGISTER, ticket.registry(), [ticket.task_id, ttl_ms(ttl), ticket.payload])

    @staticmethod
    def renew_in(pipe: Any, ticket: Ticket, ttl: float) -> None:
        eval_in(pipe, RENEW, ticket.registry(), [ticket.task_id, ttl_ms(ttl)])

    @staticmethod
    def unregister_in(pipe: Any, ticket: Ticket) -> None:
        eval_in(pipe, UNREGISTER, ticket.registry(), [ticket.task_id])

    # on their own

    @guarded
    def register(self, ticket: Ticket, within_s: float) -> None:
        """Register (or re-register) `ticket`, due in `within_s` seconds."""
        ms = ttl_ms(max(0.001, within_s))
        self._r.eval(REGISTER, 2, *ticket.registry(), ticket.task_id, ms, ticket.payload)

    def defer(self, ticket: Ticket, delay_s: float, ttl: float) -> None:
        """The task retries in `delay_s`: due `ttl` after that, as its next retry."""
        self.register(replace(ticket, retries=ticket.retries + 1), max(0.0, delay_s) + ttl)

    @guarded
    def leave(self, ticket: Ticket) -> None:
        """The job is over (finished, dead-lettered, or another job covers it)."""
        self._r.eval(UNREGISTER, 2, *ticket.registry(), ticket.task_id)

    @guarded
    def reap(self, queue: str, limit: int = 100) -> list[Ticket]:
        """Take up to `limit` of `queue`'s entries past their deadline (no one else gets them)."""
        ks = [keys.inflight_deadlines(queue), keys.inflight_jobs(queue)]
        flat = self._r.eval(REAP, 2, *ks, max(1, limit))
        out = []
        for task_id, raw in zip(flat[::2], flat[1::2], strict=True):
            job = json.loads(raw)
            out.append(Ticket(text(task_id), queue, job["kwargs"], int(job["retries"])))
        return out

    @guarded_read
    def running(self, queue: str) -> int:
        """How many jobs of `queue` are registered now."""
        return int(self._r.zcard(keys.inflight_deadlines(queue)))
