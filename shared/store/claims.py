"""A summary job's Redis work in few round trips: claim and read, count and write, release.

A job used to make nine round trips (lease, snapshot, book, ratio, existing record, usage,
record, release, metadata). In a worker running hundreds of jobs on one event loop each is
also a wait that hands the GIL to another thread and back, which costs more than the command.
Here the same commands go out in three pipelines, in the same order, with the same atomicity:

- `claim`: the lease (SET NX PX) and, only if it was taken, the conversation's metadata,
  messages, prefix hashes, summary records and blocked range, in one Lua script (a job that
  finds the lease held reads nothing but the holder's id); the tenant's calibration ratio of
  the job's model rides along;
- `commit`: the tenant's usage counters, then the record (SET NX and its index), two scripts
  in one pipeline: the spend is counted before the write, and counted even if the write fails;
  then the record's copy in the tenant's directory, a round trip of its own (another slot)
  plus the check that the conversation still holds it (`RecordStore.publish`);
- `release`: the lease given up (compare-and-delete), then the conversation's metadata read,
  in one pipeline: the "did it change while I worked" check still follows the release.

A job's in-flight entry (`shared.store.inflight`) rides along: registered with the claim,
renewed with the lease, removed with the release; so does the summarizer's breaker, read with
the claim (`shared.store.breaker`).

Scripts are sent with EVAL (`eval_in`): Redis caches them by hash, and a pipeline of EVALSHAs
would need a SCRIPT EXISTS round trip of its own (redis-py checks before every such pipeline).
On a Redis Cluster each command of these pipelines goes to the node serving its slot (the
conversation's, the tenant's, the queue's, the breakers'), all nodes at once; none is a MULTI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.errors import NotFound, StoreUnavailable
from shared.hashing import EMPTY
from shared.logs import get_logger
from shared.store import keys
from shared.store.breaker import CLOSED, Breakers, BreakerState, state_of
from shared.store.client import Client, eval_in, guarded, guarded_once, text, ttl_ms
from shared.store.compression import unpack
from shared.store.conversations import Conversation, ConversationMeta, meta_of
from shared.store.inflight import InFlight, Ticket
from shared.store.leases import RELEASE, HeldLease, Lease, check_owner
from shared.store.records import PUT, RecordStore, put_args, put_result
from shared.store.usage import ADD, usage_args
from shared.summaries.book import SummaryBook, SummaryRecord

log = get_logger(__name__)

# KEYS: lease, msgs, hashes, meta, index, blocked. ARGV: owner, ttl ms, record prefix.
# {0, holder} if the lease is held; else {1, meta (HGETALL), messages, hashes, records,
# the origin of the conversation's blocked range or false}.
CLAIM = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('GET', KEYS[1])}
end
local records = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
  local rec = redis.call('GET', ARGV[3] .. member)
  if rec then records[#records + 1] = rec end
end
return {1, redis.call('HGETALL', KEYS[4]), redis.call('LRANGE', KEYS[2], 0, -1),
        redis.call('LRANGE', KEYS[3], 0, -1), records, redis.call('HGET', KEYS[6], 'from')}
"""


@dataclass(frozen=True)
class Claim:
    """What `claim` found. `held` is None when another owner (`holder`) has the lease.

    With the lease: `conversation` and `book` as read under it (None: the conversation is
    gone), the model's calibration ratio if it was asked for (None: never observed), the
    origin of the conversation's blocked range if any (`shared.store.blocks`), and the
    summarizer's breaker if one was named.
    """

    held: HeldLease | None
    holder: str | None = None
    conversation: Conversation | None = None
    book: SummaryBook | None = None
    ratio: float | None = None
    blocked: str | None = None
    breaker: BreakerState = CLOSED


class Claims:
    """The merged round trips of a summary job, over the store's parts on one client."""

    def __init__(
        self, client: Client, leases: Lease, records: RecordStore, *, retention_s: float
    ) -> None:
        self._r = client
        self._leases = leases
        self._records = records
        self._ttl = ttl_ms(retention_s)

    @guarded_once  # the claim script, the ratio, the breaker and the in-flight entry: 2+ slots
    def claim(
        self,
        tenant: str,
        conv_id: str,
        owner: str,
        ttl: float,
        *,
        ratio_of: str | None = None,
        ticket: Ticket | None = None,
        provider: str | None = None,
    ) -> Claim:
        """Take the conversation's lease and read what a job plans on, in one round trip.

        `ratio_of`: also read the tenant's calibration ratio of this model ("" for no model).
        `ticket`: also register the job as in flight (`shared.store.inflight`), renewed with
        the lease. `provider`: also read the summarizer's breaker (`shared.store.breaker`).
        """
        started = self._leases.clock()
        ks = [
            keys.conv_lease(tenant, conv_id),
            keys.conv_messages(tenant, conv_id),
            keys.conv_hashes(tenant, conv_id),
            keys.conv_meta(tenant, conv_id),
            keys.conv_index(tenant, conv_id),
            keys.conv_blocked(tenant, conv_id),
        ]
        pipe = self._r.pipeline(transaction=False)
        prefix = keys.record_prefix(tenant, conv_id)
        eval_in(pipe, CLAIM, ks, [check_owner(owner), ttl_ms(ttl), prefix])
        if ratio_of is not None:
            pipe.hget(keys.ratio(tenant, ratio_of), "ratio")
        if provider is not None:
            Breakers.read_in(pipe, provider)
        if ticket is not None:
            InFlight.register_in(pipe, ticket, ttl)
        acks = self._records.replication.wait_in(pipe, ks[0])  # last: the replies keep their places
        replies = self._records.replication.execute(pipe, acks)
        reply = replies[0]
        if not reply[0]:
            return Claim(None, holder=text(reply[1]) if reply[1] is not None else None)
        self._records.replication.check(acks, replies[-1])  # the lease expires if not
        held = HeldLease(
            self._leases, tenant, conv_id, owner, ttl, valid_until=started + ttl, ticket=ticket
        )
        ratio = float(text(replies[1])) if ratio_of is not None and replies[1] is not None else None
        breaker = state_of(replies[2 if ratio_of is not None else 1]) if provider else CLOSED
        _, raw_meta, raw_messages, raw_hashes, raw_records, raw_blocked = reply
        book = SummaryBook([SummaryRecord.from_json(r) for r in raw_records])
        blocked = text(raw_blocked) if raw_blocked else None
        if not raw_meta:
            return Claim(held, book=book, ratio=ratio, blocked=blocked, breaker=breaker)
        messages = [json.loads(unpack(m)) for m in raw_messages]
        chain = (EMPTY, *(text(h) for h in raw_hashes))
        fields = dict(zip(raw_meta[::2], raw_meta[1::2], strict=True))
        meta = meta_of(conv_id, fields, len(messages))
        conversation = Conversation(messages, chain, meta)
        return Claim(held, None, conversation, book, ratio, blocked, breaker)

    def commit(
        self,
        tenant: str,
        conv_id: str,
        record: SummaryRecord,
        spent: tuple[int, int, float],
        *,
        summaries: int = 1,
    ) -> bool:
        """Count the spend (input, output tokens, cost) against the tenant, then write `record`.

        One round trip for both (the same as `usage.add` then `records.put`), then the copy in
        the tenant's directory. True if this call wrote the record (False: it existed);
        `NotFound` if the conversation is gone.
        """
        ks, args = put_args(tenant, conv_id, record, self._ttl, only_if_absent=True)
        usage_keys, usage = usage_args(tenant, *spent, summaries=summaries)
        reply = self._count_and_put(usage_keys, usage, ks, args)
        wrote, stored = put_result(reply, conv_id, args[0])
        self._records.publish(tenant, conv_id, record.prefix_hash, stored, overwrite=False)
        return wrote

    @guarded_once  # the tenant's usage and the conversation's record: two slots
    def _count_and_put(
        self, usage_keys: list[str], usage: list[Any], ks: list[str], args: list[Any]
    ) -> Any:
        pipe = self._r.pipeline(transaction=False)
        eval_in(pipe, ADD, usage_keys, usage)
        eval_in(pipe, PUT, ks, args)
        acks = self._records.replication.wait_in(pipe, ks[0])
        replies = self._records.replication.execute(pipe, acks)
        self._records.replication.check(acks, replies[-1])
        return replies[1]

    def release(self, held: HeldLease, *, read: bool = True) -> ConversationMeta | None:
        """Release `held` (and its job's in-flight entry), then read its conversation's
        metadata (None: gone, or `read` False): one round trip.

        A release that fails is left to expire (as `HeldLease.close` does); the read failing
        with it raises `StoreUnavailable`.
        """
        held.stop()
        tenant, conv_id = held.tenant, held.conv_id
        pipe = self._r.pipeline(transaction=False)
        eval_in(pipe, RELEASE, [keys.conv_lease(tenant, conv_id)], [held.owner])
        if held.ticket is not None:
            InFlight.unregister_in(pipe, held.ticket)
        if read:
            pipe.hgetall(keys.conv_meta(tenant, conv_id))
            pipe.llen(keys.conv_messages(tenant, conv_id))
        try:
            replies = self._execute(pipe)
        except StoreUnavailable:
            log.warning("lease.release_failed", tenant=tenant, conv_id=conv_id)
            raise
        if not read:
            return None
        raw_meta, length = replies[-2:]
        try:
            return meta_of(conv_id, raw_meta, int(length))
        except NotFound:
            return None

    @guarded
    def _execute(self, pipe: Any) -> list[Any]:
        return list(pipe.execute())
