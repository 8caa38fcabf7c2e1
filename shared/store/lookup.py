"""Finding a tenant's summary record for a transcript that is not stored (stateless prepare).

The tenant's directory keeps a copy of every record by prefix hash (shared/store/directory.py,
`keys.directory(tenant, prefix_hash)`), so a client that sends a whole transcript can still be
served a summary the workers made for a stored conversation with the same beginning: one MGET
over the candidate cut points, whose keys all share the tenant's slot.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.store import keys
from shared.store.client import Client, guarded_read
from shared.summaries.book import SummaryRecord


class RecordLookup:
    """Records by prefix hash, across a tenant's conversations."""

    def __init__(self, client: Client) -> None:
        self._r = client

    @guarded_read
    def longest(self, tenant: str, candidates: Sequence[tuple[int, str]]) -> SummaryRecord | None:
        """The record with the largest `upto` among `(upto, prefix_hash)` candidates, if any."""
        if not candidates:
            return None
        raw = self._r.mget([keys.directory(tenant, h) for _, h in candidates])
        best: SummaryRecord | None = None
        for (upto, h), found in zip(candidates, raw, strict=True):
            if found is None:
                continue
            record = SummaryRecord.from_json(found)
            matches = record.upto == upto and record.prefix_hash == h
            if matches and (best is None or upto > best.upto):
                best = record
        return best
