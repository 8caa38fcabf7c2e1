"""Summary jobs the broker refused, kept in Redis until a worker's reaper sends them.

When the API cannot publish a job (the broker is down), the job is kept here instead of lost:
one key per conversation holding the latest such job (`conv_unsent`, in the conversation's
slot), and the conversation in the queue's index (`unsent_index`, in the queue's registry
slot). Every worker's reaper (worker/reaper.py) sends what the index lists as soon as the broker
takes it again, so a conversation whose trigger fired during the outage gets its summary
without waiting for another turn, and the API logs one line per conversation, not per request.

The two keys live in two slots, so they are written in two steps (a cluster has no script
over both) ordered so that no job is left out of the index: `keep` writes the job, then
indexes it; `sent` takes the conversation out of the index, then deletes the job only if it
is still the one sent, and indexes it again if a newer one came meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text, ttl_ms

# KEYS: unsent job. ARGV: the JSON sent. Deleted only if unchanged; 1 if deleted.
FORGET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

KEEP_S = 3600.0  # an outage longer than this loses the job; the conversation's next turn asks again


@dataclass(frozen=True)
class UnsentJob:
    """A job the broker refused: its task kwargs and priority rank, as kept."""

    tenant: str
    conversation_id: str
    kwargs: Mapping[str, Any]
    priority: int
    raw: str  # the stored JSON, to delete exactly this job once sent


class Unsent:
    """The unsent summary jobs of every queue, on one Redis client."""

    def __init__(self, client: Client) -> None:
        self._r = client
        self._forget = client.register_script(FORGET)

    @guarded
    def keep(self, queue: str, kwargs: Mapping[str, Any], priority: int) -> bool:
        """Keep `kwargs` (a job's) as its conversation's unsent job, replacing an older one;
        True if the conversation had none (the first refusal since its last send)."""
        tenant, conv_id = str(kwargs["tenant"]), str(kwargs["conversation_id"])
        raw = json.dumps({"kwargs": dict(kwargs), "priority": priority}, sort_keys=True)
        before = self._r.set(keys.conv_unsent(tenant, conv_id), raw, px=ttl_ms(KEEP_S), get=True)
        member = f"{tenant}/{conv_id}"
        self._r.zadd(keys.unsent_index(queue), {member: int(time.time() * 1000)}, nx=True)
        return before is None

    @guarded_read
    def due(self, queue: str, limit: int) -> list[UnsentJob]:
        """Up to `limit` unsent jobs of `queue`, oldest first (index entries whose job has
        expired are dropped)."""
        listed: list[bytes] = self._r.zrange(keys.unsent_index(queue), 0, limit - 1)  # type: ignore[assignment]
        members = [text(m) for m in listed]
        found: list[UnsentJob] = []
        for member in members:
            tenant, _, conv_id = member.partition("/")
            raw = self._r.get(keys.conv_unsent(tenant, conv_id))
            if raw is None:
                self._r.zrem(keys.unsent_index(queue), member)
                continue
            value = json.loads(raw)
            found.append(UnsentJob(tenant, conv_id, value["kwargs"], value["priority"], text(raw)))
        return found

    @guarded
    def sent(self, queue: str, job: UnsentJob) -> None:
        """`job` is on the broker now: forget it, unless a newer job was kept meanwhile."""
        member = f"{job.tenant}/{job.conversation_id}"
        index = keys.unsent_index(queue)
        self._r.zrem(index, member)
        key = keys.conv_unsent(job.tenant, job.conversation_id)
        if not self._forget(keys=[key], args=[job.raw]) and self._r.exists(key):
            self._r.zadd(index, {member: int(time.time() * 1000)}, nx=True)

    @guarded_read
    def count(self, queue: str) -> int:
        """How many conversations have an unsent job for `queue`."""
        return int(self._r.zcard(keys.unsent_index(queue)))
