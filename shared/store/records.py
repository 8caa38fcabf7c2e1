"""Summary records: content addressed per tenant, indexed per conversation.

A record lives at `keys.record(tenant, prefix_hash)`, so two conversations of one tenant with
an identical prefix share it, while two tenants never do (the tenant is part of the key).
Each conversation has an index (ZSET, member prefix hash, score upto) of the records it uses,
and each record a set of the conversations pointing at it: deleting one conversation removes
a shared record only once no other conversation uses it.

To reuse another conversation's summary, a worker `get`s the record by prefix hash and `put`s
it for its own conversation: the put links it (and returns False) instead of writing it again.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import redis

from shared import keys
from shared.errors import ConfigError, NotFound
from shared.store.client import guarded, ttl_ms
from shared.summaries import SummaryBook, SummaryRecord

# KEYS: meta, index, record, refs. ARGV: json, upto, conversation id, ttl ms, only-if-absent
# ('1'/'0'), prefix hash. -1 when the conversation does not exist (e.g. deleted meanwhile).
PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local created
if ARGV[5] == '1' then
  created = redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[4])
  if not created then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
else
  created = redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[4])
end
redis.call('SADD', KEYS[4], ARGV[3])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if created then return 1 end
return 0
"""

# KEYS: index, stored hashes. ARGV: record prefix, highest upto ('+inf' for any), mode
# ('stored' compares with the conversation's stored chain, 'given' with ARGV[4 + upto]).
BEST = """
local entries = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], 1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local member, upto = entries[i], tonumber(entries[i + 1])
  local current
  if ARGV[3] == 'given' then
    current = ARGV[4 + upto]
  else
    current = redis.call('LINDEX', KEYS[2], upto - 1)
  end
  if current == member then
    local rec = redis.call('GET', ARGV[1] .. member)
    if rec then return rec end
  end
end
return false
"""

# KEYS: index. ARGV: record prefix. Every record still present, lowest upto first.
LIST = """
local out = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local rec = redis.call('GET', ARGV[1] .. member)
  if rec then out[#out + 1] = rec end
end
return out
"""


class RecordStore:
    """Summary records of every tenant, on one Redis client."""

    def __init__(self, client: redis.Redis, *, retention_s: float) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._put = client.register_script(PUT)
        self._best = client.register_script(BEST)
        self._list = client.register_script(LIST)

    @guarded
    def put(
        self, tenant: str, conv_id: str, record: SummaryRecord, *, only_if_absent: bool = True
    ) -> bool:
        """Store `record` for the conversation; True if this call wrote it.

        With `only_if_absent` (the default) exactly one record exists per prefix even when
        workers race: a later put only links the existing record to the conversation.
        `NotFound` if the conversation does not exist (it may have been deleted meanwhile).
        """
        ks, args = put_args(tenant, conv_id, record, self._ttl, only_if_absent=only_if_absent)
        return put_result(self._put(keys=ks, args=args), conv_id)

    @guarded
    def get(self, tenant: str, prefix_hash: str) -> SummaryRecord | None:
        """The tenant's record for exactly this prefix, if any."""
        raw = self._r.get(keys.record(tenant, prefix_hash))
        return SummaryRecord.from_json(raw) if raw is not None else None

    @guarded
    def best(
        self,
        tenant: str,
        conv_id: str,
        hashes: Sequence[str] | None = None,
        *,
        upto_max: int | None = None,
    ) -> SummaryRecord | None:
        """The record covering the longest matching prefix, in one round trip.

        `hashes` are the transcript's `prefix_hashes` (len n+1); without them the
        conversation's stored chain is used. `upto_max` limits how far the record may reach.
        """
        ks = [keys.conv_index(tenant, conv_id), keys.conv_hashes(tenant, conv_id)]
        limit: Any = "+inf" if upto_max is None else int(upto_max)
        args: list[Any] = [keys.record_prefix(tenant), limit]
        args += ["stored"] if hashes is None else ["given", *hashes]
        raw = self._best(keys=ks, args=args)
        return SummaryRecord.from_json(raw) if raw is not None else None

    @guarded
    def book(self, tenant: str, conv_id: str) -> SummaryBook:
        """Every record the conversation's index points at, as a `SummaryBook`."""
        return SummaryBook(self._records(tenant, conv_id))

    @guarded
    def list(self, tenant: str, conv_id: str) -> builtins.list[SummaryRecord]:
        """The conversation's records, lowest upto first (for the GET route)."""
        return self._records(tenant, conv_id)

    def _records(self, tenant: str, conv_id: str) -> builtins.list[SummaryRecord]:
        ks = [keys.conv_index(tenant, conv_id)]
        raw = self._list(keys=ks, args=[keys.record_prefix(tenant)])
        return [SummaryRecord.from_json(r) for r in raw]


def put_args(
    tenant: str, conv_id: str, record: SummaryRecord, ttl_ms: int, *, only_if_absent: bool
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the `PUT` script for `record` (checked first)."""
    check_record(record)
    h = record.prefix_hash
    ks = [
        keys.conv_meta(tenant, conv_id),
        keys.conv_index(tenant, conv_id),
        keys.record(tenant, h),
        keys.record_refs(tenant, h),
    ]
    flag = "1" if only_if_absent else "0"
    return ks, [record.to_json(), record.upto, conv_id, ttl_ms, flag, h]


def put_result(reply: Any, conv_id: str) -> bool:
    """What the `PUT` script's reply means: True if it wrote the record; `NotFound` if the
    conversation is gone."""
    result = int(reply)
    if result < 0:
        raise NotFound(f"conversation {conv_id!r} not found")
    return result == 1


def check_record(record: SummaryRecord) -> None:
    """`ConfigError` unless `record` can be stored."""
    if not isinstance(record, SummaryRecord):
        raise ConfigError(f"expected a SummaryRecord, got {type(record).__name__}")
    if isinstance(record.upto, bool) or not isinstance(record.upto, int) or record.upto < 1:
        raise ConfigError(f"summary record upto must be a positive integer, got {record.upto!r}")
    keys.check_prefix_hash(record.prefix_hash)
    if not isinstance(record.text, str):
        raise ConfigError("summary record text must be a string")
