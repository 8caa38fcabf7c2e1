"""Failed summary ranges: one attempt budget per range, and a block once it is spent.

A summary job plans a range of a conversation, from the record it folds into (its `origin`:
the record's hash, or "none" before the first) up to a cut (`prefix_hash`). Every failed
attempt at the range counts against one budget, kept in Redis and shared by every job and
retry that plans it (`max_redeliveries`), so neither a retry nor a new job starts the count
over. When it is spent, or at once for a permanent error, the range is *blocked*: until the
block expires, the conversation's jobs that start from that origin end without calling, and
the API schedules none (`shared.store.pending`). A block lasts `base_s` the first time, twice
as long each time the conversation is blocked again, up to `max_s`. A record written for the
conversation meanwhile (another origin) lifts it, and so do deleting the conversation and
replacing its transcript with one that no longer holds the blocked range's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text, ttl_ms
from shared.summaries.book import SummaryRecord

# KEYS: attempts, blocked, block count. ARGV: origin, upto, prefix hash, error, limit,
# permanent (0/1), base ms, max ms. -> {attempts (-1: blocked already), block ms (0: none)}.
FAIL = """
if redis.call('HGET', KEYS[2], 'from') == ARGV[1] then return {-1, 0} end
local n = redis.call('INCR', KEYS[1])
local limit = tonumber(ARGV[5])
if n <= limit and ARGV[6] ~= '1' then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[8]))
  return {n, 0}
end
redis.call('DEL', KEYS[1])
local blocks = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], 4 * tonumber(ARGV[8]))
local pause = math.min(tonumber(ARGV[8]), tonumber(ARGV[7]) * 2 ^ (blocks - 1))
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'from', ARGV[1], 'upto', ARGV[2], 'prefix_hash', ARGV[3],
           'error', ARGV[4])
redis.call('PEXPIRE', KEYS[2], pause)
return {n, pause}
"""

MAX_ERROR_CHARS = 300


def origin(record: SummaryRecord | None) -> str:
    """The origin of a range that folds into `record`: its hash's hex, or "none"."""
    return record.prefix_hash.partition(":")[2] if record is not None else "none"


@dataclass(frozen=True)
class Range:
    """A planned summary: from the record `origin` up to `upto` (the prefix `prefix_hash`)."""

    origin: str
    upto: int
    prefix_hash: str


@dataclass(frozen=True)
class Failure:
    """What counting one failure did. `attempts` -1: the range was blocked already (by
    another job); `blocked_s` > 0: this failure spent the budget and blocked it for that long."""

    attempts: int
    blocked_s: float = 0.0


@dataclass(frozen=True)
class Block:
    """A blocked range, as stored (`ttl_s`: how long it still lasts)."""

    range: Range
    error: str
    ttl_s: float


class Blocks:
    """Attempt budgets and blocks of every tenant's summary ranges, on one Redis client."""

    def __init__(self, client: Client, *, base_s: float, max_s: float) -> None:
        self._r = client
        self.base_s, self.max_s = base_s, max(base_s, max_s)

    @guarded
    def fail(
        self, tenant: str, conv_id: str, rng: Range, error: str, *, limit: int, permanent: bool
    ) -> Failure:
        """Count a failed attempt at `rng`; block it once more than `limit` failed (or now)."""
        ks = [
            keys.conv_attempts(tenant, conv_id, rng.prefix_hash),
            keys.conv_blocked(tenant, conv_id),
            keys.conv_block_count(tenant, conv_id),
        ]
        args = (
            rng.origin,
            rng.upto,
            rng.prefix_hash,
            error[:MAX_ERROR_CHARS],
            max(0, limit),
            1 if permanent else 0,
            ttl_ms(self.base_s),
            ttl_ms(self.max_s),
        )
        attempts, pause = (int(x) for x in self._r.eval(FAIL, 3, *ks, *args))
        return Failure(attempts, pause / 1000)

    @guarded_read
    def get(self, tenant: str, conv_id: str) -> Block | None:
        """The conversation's block, if one is in force."""
        key = keys.conv_blocked(tenant, conv_id)
        pipe = self._r.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.pttl(key)
        raw, pttl = pipe.execute()
        if not raw:
            return None
        f = {text(k): text(v) for k, v in raw.items()}
        rng = Range(f["from"], int(f["upto"]), f["prefix_hash"])
        return Block(rng, f.get("error", ""), max(0, int(pttl)) / 1000)
