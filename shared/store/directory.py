"""The tenant's directory of summary records by prefix hash: one summary, many conversations.

A record lives in its conversation's slot (shared/store/keys.py), beside the messages it
summarizes. Two features look for records across a tenant's conversations: a forked
conversation (one that begins as another does) reuses the other's record instead of paying
for a new summary (the workers' `exists` path, shared/service/precompute.py), and the stateless
`/v1/prepare` serves a record to a transcript that is not stored at all (shared/store/lookup.py).
So each record is also copied into the tenant's slot: `keys.directory(tenant, h)` holds a copy
of a record for the prefix `h`, and `keys.directory_refs(tenant, h)` the ids of the
conversations holding one.

The directory is written after the record and dropped after it, as a second step (no script
may touch two slots), and is best effort: a copy that could not be written costs a fork a
summary of its own, never a wrong answer (copies are looked up by content: a prefix hash).

- `link` copies a record just stored for a conversation (the first copy stays, as records are
  written once) and adds the conversation to the refs, both for the retention;
- `drop`, once a conversation's records are gone (deleted, or replaced text), takes the
  conversation out of their refs; an entry no conversation refers to any more goes with it.

An entry therefore outlives the records it copies only when a second step failed (Redis
unreachable between the two), and then by at most the retention, as an idle conversation's
own keys do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.errors import StoreUnavailable
from shared.logs import get_logger
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, ttl_ms
from shared.summaries.book import SummaryRecord

log = get_logger(__name__)

# KEYS: entry, refs. ARGV: record JSON, conversation id, ttl ms, overwrite ('1'/'0').
LINK = """
if ARGV[4] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: entry, refs of each prefix hash in turn. ARGV: conversation id.
DROP = """
for i = 1, #KEYS, 2 do
  redis.call('SREM', KEYS[i + 1], ARGV[1])
  if redis.call('SCARD', KEYS[i + 1]) == 0 then redis.call('DEL', KEYS[i], KEYS[i + 1]) end
end
return 1
"""


class Directory:
    """Every tenant's record copies by prefix hash, on one Redis client."""

    def __init__(self, client: Client, *, retention_s: float) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._link = client.register_script(LINK)
        self._drop = client.register_script(DROP)

    def link(
        self, tenant: str, conv_id: str, prefix_hash: str, raw: str | bytes, *, overwrite: bool
    ) -> bool:
        """Copy a record the conversation holds (`raw`, its JSON) and refer it to the copy;
        False if Redis did not answer (logged: the record is stored, only not shared)."""
        ks = [keys.directory(tenant, prefix_hash), keys.directory_refs(tenant, prefix_hash)]
        args = [raw, keys.check_id("conversation", conv_id), self._ttl, "1" if overwrite else "0"]
        try:
            self._run(self._link, ks, args)
        except StoreUnavailable:
            log.warning("directory.link_failed", tenant=tenant, conv_id=conv_id)
            return False
        return True

    def drop(self, tenant: str, conv_id: str, prefix_hashes: Sequence[str]) -> None:
        """The conversation no longer holds records for `prefix_hashes`: unrefer it, and drop
        the entries nobody refers to any more (if Redis does not answer, logged: the entries
        then expire with the retention)."""
        ks = []
        for h in prefix_hashes:
            ks += [keys.directory(tenant, h), keys.directory_refs(tenant, h)]
        if not ks:
            return
        try:
            self._run(self._drop, ks, [keys.check_id("conversation", conv_id)])
        except StoreUnavailable:
            log.warning(
                "directory.drop_failed", tenant=tenant, conv_id=conv_id, copies=len(ks) // 2
            )

    @guarded
    def _run(self, script: Any, ks: list[str], args: list[Any]) -> None:
        script(keys=ks, args=args)

    @guarded_read
    def get(self, tenant: str, prefix_hash: str) -> SummaryRecord | None:
        """A copy of a record some conversation of the tenant holds for exactly this prefix."""
        raw = self._r.get(keys.directory(tenant, prefix_hash))
        return SummaryRecord.from_json(raw) if raw is not None else None

    @guarded_read
    def refs(self, tenant: str, prefix_hash: str) -> set[str]:
        """The conversations an entry refers to (for operators and tests)."""
        found = self._r.smembers(keys.directory_refs(tenant, prefix_hash))
        return {m.decode() if isinstance(m, bytes) else str(m) for m in found}
