"""Pending summary jobs: one marker per conversation state, so one trigger of many enqueues.

The API schedules a summary job (api/schedule.py) by setting the conversation's marker for
the state it is in (the kind of ask, the record served, the size step); only the caller that
sets it sends the job. The marker lives `ttl` seconds, so a job lost on the way is asked for
again. It is set in the round trip that checks the conversation's block (`shared.store.blocks`):
a range whose summary was dead-lettered lately is not asked for until the block expires. An
index of the conversation's markers (living as long as its longest marker) lets deleting the
conversation drop them all (`ConversationStore.delete`).
"""

from __future__ import annotations

from shared.store import keys
from shared.store.client import Client, guarded, ttl_ms

# KEYS: blocked, marker, marker index. ARGV: origin, marker ttl ms.
# -> -1 blocked, 1 set now, 0 set before.
MARK = """
if redis.call('HGET', KEYS[1], 'from') == ARGV[1] then return -1 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SADD', KEYS[3], KEYS[2])
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end
return 1
"""


class Pending:
    """The conversations' pending-job markers."""

    def __init__(self, client: Client) -> None:
        self._r = client

    @guarded
    def mark(self, tenant: str, conv_id: str, marker: str, source: str, ttl: float) -> int:
        """Set the marker (conversation, `marker`) for `ttl` seconds, unless a block stops
        jobs from `source` (an origin: `shared.store.blocks.origin`).

        Lets 50 triggers for one conversation state enqueue one job: only the caller that gets
        1 sends it (0: marked already within `ttl`; -1: the conversation's range from `source`
        is blocked, send nothing).
        """
        ks = [
            keys.conv_blocked(tenant, conv_id),
            keys.conv_pending(tenant, conv_id, marker),
            keys.conv_pending_index(tenant, conv_id),
        ]
        return int(self._r.eval(MARK, 3, *ks, source, ttl_ms(ttl)))

    @guarded
    def clear(self, tenant: str, conv_id: str, marker: str) -> None:
        """Drop a marker, so the next trigger for that state schedules the job again."""
        self._r.delete(keys.conv_pending(tenant, conv_id, marker))
