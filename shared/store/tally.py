"""A conversation's running token tally, so an append never recounts the whole conversation.

Beside the messages the API keeps a LIST of cumulative *base* (uncalibrated) token counts,
element i counting the first i+1 messages, plus a HASH saying what the list counts: the id of
the counter that made it, the prefix hash of the messages it covers, and where the head ends.
With it, the effective tokens of "head + best summary + the rest" are three list reads:
`total - cum[upto] + cum[head] + summary`, whatever the conversation's length.

The tally is a cache: every write is compare-and-set on the prefix hash it extends, and a
tally whose `hash` or length disagrees with the stored chain is simply rebuilt by the caller
(O(n), once). It is written after the messages (a second round trip), so a crash in between
costs a rebuild, never a wrong count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from shared import keys
from shared.messages import Message
from shared.store.chain import EMPTY
from shared.store.client import guarded, text, ttl_ms
from shared.summaries import SummaryRecord

# KEYS: tally, info, summary index, stored hashes. ARGV: ttl ms, counter id, old hash, old
# length, new hash, head end, upto max, record prefix, n, then n cumulative counts
# (ARGV[10..9+n]). Extends the tally if it still ends at the old hash (a conversation's first
# append finds none), else drops it so the next reader rebuilds it; then finds the best record
# within upto max as `records.BEST` does on the stored chain, and reads the tally at its upto
# and at the head end. Returns {extended (1/0), record JSON or nil, cum[upto], cum[head]}.
EXTEND = """
local counter = redis.call('HGET', KEYS[2], 'counter')
local hash = redis.call('HGET', KEYS[2], 'hash')
local ok = counter == ARGV[2] and hash == ARGV[3]
if not counter and tonumber(ARGV[4]) == 0 then ok = true end
if ok and redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[4]) then ok = false end
if ok then
  local n = tonumber(ARGV[9])
  local i = 10
  while i <= 9 + n do
    local j = math.min(i + 999, 9 + n)
    redis.call('RPUSH', KEYS[1], unpack(ARGV, i, j))
    i = j + 1
  end
  redis.call('HSET', KEYS[2], 'counter', ARGV[2], 'hash', ARGV[5], 'head_end', ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
local record, upto = false, 0
local entries = redis.call('ZREVRANGEBYSCORE', KEYS[3], ARGV[7], 1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local member, u = entries[i], tonumber(entries[i + 1])
  if redis.call('LINDEX', KEYS[4], u - 1) == member then
    local found = redis.call('GET', ARGV[8] .. member)
    if found then
      record, upto = found, u
      break
    end
  end
end
if not ok then return {0, record, 0, 0} end
local function cum(p)
  if p <= 0 then return 0 end
  return tonumber(redis.call('LINDEX', KEYS[1], p - 1) or 0)
end
return {1, record, cum(upto), cum(tonumber(ARGV[6]))}
"""

# KEYS: tally, info, messages, hashes. ARGV: ttl ms, counter id, hash, head end, n, then n
# cumulative counts (ARGV[6..5+n]). Written only if the stored messages are still the ones counted.
REBUILD = """
local len = redis.call('LLEN', KEYS[3])
if len ~= tonumber(ARGV[5]) then return 0 end
if len > 0 and redis.call('LINDEX', KEYS[4], -1) ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
local n = tonumber(ARGV[5])
local i = 6
while i <= 5 + n do
  local j = math.min(i + 999, 5 + n)
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, j))
  i = j + 1
end
redis.call('HSET', KEYS[2], 'counter', ARGV[2], 'hash', ARGV[3], 'head_end', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Tip:
    """The end of a stored conversation and its tally, read atomically in one round trip.

    `tail` holds the last messages (`tail_offset` is the index of the first); `total` is the
    tally's count of all `length` messages, None unless the tally is current for `counter`.
    """

    exists: bool
    length: int
    last_hash: str
    tail: list[Message]
    tail_offset: int
    model: str | None
    total: int | None
    head_end: int | None

    @property
    def last(self) -> Message | None:
        return self.tail[-1] if self.tail else None


@dataclass(frozen=True)
class Extended:
    """What `Tally.extend` did and found: the best record within reach and the tally at its
    `upto` and at the head end (counts only when `extended`)."""

    extended: bool
    best: SummaryRecord | None
    tokens_upto: int
    tokens_head: int


class Tally:
    """Running token tallies of every tenant's conversations, on one Redis client."""

    def __init__(self, client: redis.Redis, *, retention_s: float) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._extend = client.register_script(EXTEND)
        self._rebuild = client.register_script(REBUILD)

    @guarded
    def tip(self, tenant: str, conv_id: str, *, counter: str, tail: int) -> Tip:
        """Length, last prefix hash, model, the last `tail` messages and the tally's total."""
        pipe = self._r.pipeline(transaction=True)
        pipe.hget(keys.conv_meta(tenant, conv_id), "model")
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.llen(keys.conv_messages(tenant, conv_id))
        pipe.lindex(keys.conv_hashes(tenant, conv_id), -1)
        pipe.lrange(keys.conv_messages(tenant, conv_id), -max(1, tail), -1)
        pipe.hmget(keys.conv_tally_info(tenant, conv_id), ["counter", "hash", "head_end"])
        pipe.llen(keys.conv_tally(tenant, conv_id))
        pipe.lindex(keys.conv_tally(tenant, conv_id), -1)
        model, exists, length, last, raw, info, tally_len, total = pipe.execute()
        length = int(length)
        last_hash = text(last) if last is not None else EMPTY
        current = (
            info[0] is not None
            and text(info[0]) == counter
            and info[1] is not None
            and text(info[1]) == last_hash
            and int(tally_len) == length
        )
        return Tip(
            exists=bool(exists),
            length=length,
            last_hash=last_hash,
            tail=[json.loads(m) for m in raw] if length else [],
            tail_offset=length - len(raw) if length else 0,
            model=text(model) if model is not None else None,
            total=(int(total) if total is not None else 0) if current else None,
            head_end=int(info[2]) if current and info[2] is not None else None,
        )

    @guarded
    def read(self, tenant: str, conv_id: str, *, start: int, stop: int) -> list[Message]:
        """Stored messages [start, stop) (no existence check: the caller read the tip)."""
        if stop <= start:
            return []
        raw = self._r.lrange(keys.conv_messages(tenant, conv_id), start, stop - 1)
        return [json.loads(m) for m in raw]

    @guarded
    def at(self, tenant: str, conv_id: str, positions: Sequence[int]) -> list[int]:
        """The tally at each position (the count of the first `p` messages; 0 for p = 0)."""
        key = keys.conv_tally(tenant, conv_id)
        wanted = [p for p in positions if p > 0]
        pipe = self._r.pipeline(transaction=False)
        for p in wanted:
            pipe.lindex(key, p - 1)
        found = dict(zip(wanted, pipe.execute(), strict=True))
        return [int(found[p]) if p > 0 and found[p] is not None else 0 for p in positions]

    @guarded
    def extend(
        self,
        tenant: str,
        conv_id: str,
        *,
        counter: str,
        old_hash: str,
        old_length: int,
        new_hash: str,
        head_end: int,
        cumulative: Sequence[int],
        upto_max: int,
    ) -> Extended:
        """Push the counts of appended messages, then measure against the best record.

        The tally is extended only if it still ends at `old_hash`; on a mismatch it is
        dropped (`extended` False, no counts) and the next reader rebuilds it.
        """
        ks = [
            keys.conv_tally(tenant, conv_id),
            keys.conv_tally_info(tenant, conv_id),
            keys.conv_index(tenant, conv_id),
            keys.conv_hashes(tenant, conv_id),
        ]
        args: list[Any] = [
            self._ttl,
            counter,
            old_hash,
            old_length,
            new_hash,
            head_end,
            upto_max,
            keys.record_prefix(tenant),
            len(cumulative),
            *cumulative,
        ]
        ok, raw, at_upto, at_head = self._extend(keys=ks, args=args)
        record = SummaryRecord.from_json(raw) if raw is not None else None
        return Extended(bool(ok), record, int(at_upto), int(at_head))

    @guarded
    def rebuild(
        self,
        tenant: str,
        conv_id: str,
        *,
        counter: str,
        last_hash: str,
        head_end: int,
        cumulative: Sequence[int],
    ) -> bool:
        """Write a whole tally, only if the stored conversation is still the one counted."""
        ks = [
            keys.conv_tally(tenant, conv_id),
            keys.conv_tally_info(tenant, conv_id),
            keys.conv_messages(tenant, conv_id),
            keys.conv_hashes(tenant, conv_id),
        ]
        args: list[Any] = [self._ttl, counter, last_hash, head_end, len(cumulative), *cumulative]
        return bool(self._rebuild(keys=ks, args=args))

    @guarded
    def delete(self, tenant: str, conv_id: str) -> None:
        """Drop the tally (the conversation itself is deleted by `ConversationStore.delete`)."""
        self._r.delete(keys.conv_tally(tenant, conv_id), keys.conv_tally_info(tenant, conv_id))
