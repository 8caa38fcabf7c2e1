"""Summary records: per conversation, by prefix hash, with a copy in the tenant's directory.

A record lives at `keys.record(tenant, conv_id, prefix_hash)`, in its conversation's slot, and
the conversation's index (ZSET, member prefix hash, score upto) lists them: every script here
touches that one slot. Records are written once per prefix (SET NX), go with the conversation
(deleted, expired, or the text they summarize replaced) and are never shared by two tenants.

Once stored, a record is also copied into the tenant's directory (shared/store/directory.py),
in a second step: that is how a forked conversation finds a summary to reuse (`get`, then
`put` for its own conversation: a copy, no LLM call) and a stateless prepare finds one.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from shared.errors import ConfigError, NotFound, StoreUnavailable
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text, ttl_ms
from shared.store.directory import Directory
from shared.store.replication import Replication
from shared.summaries.book import SummaryBook, SummaryRecord

# KEYS: meta, index, record. ARGV: json, upto, ttl ms, only-if-absent ('1'/'0'), prefix hash.
# {-1} when the conversation does not exist (e.g. deleted meanwhile); {1} when this call wrote
# the record, {0, the stored JSON} when one was there already.
PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local created
if ARGV[4] == '1' then
  created = redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[3])
  if not created then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
else
  created = redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if created then return {1} end
return {0, redis.call('GET', KEYS[3])}
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

    def __init__(
        self, client: Client, *, retention_s: float, replication: Replication | None = None
    ) -> None:
        self._r = client
        self.replication = replication or Replication.never(client)
        self._ttl = ttl_ms(retention_s)
        self._put = client.register_script(PUT)
        self._best = client.register_script(BEST)
        self._list = client.register_script(LIST)
        self.directory = Directory(client, retention_s=retention_s)

    def put(
        self, tenant: str, conv_id: str, record: SummaryRecord, *, only_if_absent: bool = True
    ) -> bool:
        """Store `record` for the conversation, then copy it to the tenant's directory; True if
        this call wrote it.

        With `only_if_absent` (the default) exactly one record exists per prefix of a
        conversation even when workers race: a later put leaves the first one.
        `NotFound` if the conversation does not exist (it may have been deleted meanwhile).
        """
        ks, args = put_args(tenant, conv_id, record, self._ttl, only_if_absent=only_if_absent)
        wrote, stored = put_result(self._run_put(ks, args), conv_id, args[0])
        self.publish(tenant, conv_id, record.prefix_hash, stored, overwrite=not only_if_absent)
        return wrote

    @guarded
    def _run_put(self, ks: list[str], args: list[Any]) -> Any:
        return self.replication.run(self._put, ks, args)

    def publish(
        self, tenant: str, conv_id: str, prefix_hash: str, raw: str | bytes, *, overwrite: bool
    ) -> None:
        """Copy a record the conversation holds into the tenant's directory (best effort).

        Then check the conversation still holds it: a delete or replace may have dropped it
        between the two steps, its own `drop` running before this link.
        """
        if not self.directory.link(tenant, conv_id, prefix_hash, raw, overwrite=overwrite):
            return
        try:
            held = self._holds(tenant, conv_id, prefix_hash)
        except StoreUnavailable:
            held = False  # unknown: unlinking costs at most a fork's reuse, keeping it retention
        if not held:
            self.directory.drop(tenant, conv_id, [prefix_hash])

    @guarded_read
    def _holds(self, tenant: str, conv_id: str, prefix_hash: str) -> bool:
        return self._r.zscore(keys.conv_index(tenant, conv_id), prefix_hash) is not None

    def get(self, tenant: str, prefix_hash: str) -> SummaryRecord | None:
        """A record some conversation of the tenant holds for exactly this prefix, if any (a
        copy, from the tenant's directory)."""
        return self.directory.get(tenant, prefix_hash)

    @guarded_read
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
        args: list[Any] = [keys.record_prefix(tenant, conv_id), limit]
        args += ["stored"] if hashes is None else ["given", *hashes]
        raw = self._best(keys=ks, args=args)
        return SummaryRecord.from_json(raw) if raw is not None else None

    @guarded
    def book(self, tenant: str, conv_id: str) -> SummaryBook:
        """Every record the conversation's index points at, as a `SummaryBook`."""
        return SummaryBook(self._records(tenant, conv_id))

    @guarded_read
    def list(self, tenant: str, conv_id: str) -> builtins.list[SummaryRecord]:
        """The conversation's records, lowest upto first (for the GET route)."""
        return self._records(tenant, conv_id)

    def _records(self, tenant: str, conv_id: str) -> builtins.list[SummaryRecord]:
        ks = [keys.conv_index(tenant, conv_id)]
        raw = self._list(keys=ks, args=[keys.record_prefix(tenant, conv_id)])
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
        keys.record(tenant, conv_id, h),
    ]
    flag = "1" if only_if_absent else "0"
    return ks, [record.to_json(), record.upto, ttl_ms, flag, h]


def put_result(reply: Any, conv_id: str, written: str) -> tuple[bool, str]:
    """What the `PUT` script's reply means: whether it wrote the record (`written`, its JSON),
    and the record's JSON as stored now; `NotFound` if the conversation is gone."""
    result = int(reply[0])
    if result < 0:
        raise NotFound(f"conversation {conv_id!r} not found")
    return result == 1, written if result == 1 else text(reply[1])


def check_record(record: SummaryRecord) -> None:
    """`ConfigError` unless `record` can be stored."""
    if not isinstance(record, SummaryRecord):
        raise ConfigError(f"expected a SummaryRecord, got {type(record).__name__}")
    if isinstance(record.upto, bool) or not isinstance(record.upto, int) or record.upto < 1:
        raise ConfigError(f"summary record upto must be a positive integer, got {record.upto!r}")
    keys.check_prefix_hash(record.prefix_hash)
    if not isinstance(record.text, str):
        raise ConfigError("summary record text must be a string")
