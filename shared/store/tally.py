"""A conversation's running token tally, so an append never recounts the whole conversation.

Beside the messages the API keeps a LIST of cumulative *base* (uncalibrated) token counts,
element i counting the first i+1 messages, plus a HASH saying what the list counts: the id of
the counter that made it, the prefix hash of the messages it covers, and where the head ends.
With it, the effective tokens of "head + best summary + the rest" are three list reads:
`total - cum[upto] + cum[head] + summary`, whatever the conversation's length.

The tally is a cache written by the same script as the messages (shared/store/writes.py): an
append extends it only if it still ends at the tip the append extends and was made by the
same counter, else drops it; a tally that is missing or disagrees with the stored chain is
simply rebuilt by the next reader (O(n), once). It never holds a wrong count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from shared.hashing import EMPTY
from shared.messages import Message
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text, ttl_ms
from shared.store.compression import unpack

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
    tally's count of all `length` messages, None unless the tally is current for `counter`;
    `bound` is the metadata's flag (shared/store/writes.py).
    """

    exists: bool
    length: int
    last_hash: str
    tail: list[Message]
    tail_offset: int
    model: str | None
    total: int | None
    head_end: int | None
    bound: bool = True

    @property
    def last(self) -> Message | None:
        return self.tail[-1] if self.tail else None


class Tally:
    """Running token tallies of every tenant's conversations, on one Redis client."""

    def __init__(self, client: Client, *, retention_s: float) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._rebuild = client.register_script(REBUILD)

    @guarded_read
    def tip(self, tenant: str, conv_id: str, *, counter: str, tail: int) -> Tip:
        """Length, last prefix hash, model, the last `tail` messages and the tally's total."""
        pipe = self._r.pipeline(transaction=True)
        pipe.hmget(keys.conv_meta(tenant, conv_id), ["model", "bound"])
        pipe.exists(keys.conv_meta(tenant, conv_id))
        pipe.llen(keys.conv_messages(tenant, conv_id))
        pipe.lindex(keys.conv_hashes(tenant, conv_id), -1)
        pipe.lrange(keys.conv_messages(tenant, conv_id), -max(1, tail), -1)
        pipe.hmget(keys.conv_tally_info(tenant, conv_id), ["counter", "hash", "head_end"])
        pipe.llen(keys.conv_tally(tenant, conv_id))
        pipe.lindex(keys.conv_tally(tenant, conv_id), -1)
        (model, bound), exists, length, last, raw, info, tally_len, total = pipe.execute()
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
            tail=[json.loads(unpack(m)) for m in raw] if length else [],
            tail_offset=length - len(raw) if length else 0,
            model=text(model) if model is not None else None,
            total=(int(total) if total is not None else 0) if current else None,
            head_end=int(info[2]) if current and info[2] is not None else None,
            bound=bound is None or text(bound) != "0",
        )

    @guarded_read
    def read(self, tenant: str, conv_id: str, *, start: int, stop: int) -> list[Message]:
        """Stored messages [start, stop) (no existence check: the caller read the tip)."""
        if stop <= start:
            return []
        raw = self._r.lrange(keys.conv_messages(tenant, conv_id), start, stop - 1)
        return [json.loads(unpack(cast(bytes, m))) for m in raw]

    @guarded_read
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
