"""Summary records and the book that finds the best one for a transcript."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.errors import InvalidTranscript
from shared.hashing import prefix_hashes
from shared.messages import Message
from shared.summaries.artifacts import ArtifactIndex


@dataclass(frozen=True)
class SummaryRecord:
    """A summary of T[head_end:upto] of the logical transcript T.

    Valid for any transcript whose first `upto` messages hash to `prefix_hash`.

    - upto: the exclusive end of the turns it stands for;
    - prefix_hash: `prefix_hash(T[:upto])`, what it is matched by;
    - text: the summary itself;
    - summarizer: the `name` of the summarizer that wrote it (`"extractive"` for the offline
      one, `"<protocol>:<model>"` for the workers' provider);
    - tokens: the summary message's size as its writer counted it;
    - created_at: when it was written (Unix seconds; 0.0: unknown);
    - artifacts: the artifact index of the range, carried to the next record (None: a record
      written before there was one; `text` ends with it rendered, see `narrative`).
    """

    upto: int
    prefix_hash: str
    text: str
    summarizer: str = ""
    tokens: int = 0
    created_at: float = 0.0
    artifacts: ArtifactIndex | None = None

    def to_json(self) -> str:
        raw = asdict(self)
        raw["artifacts"] = self.artifacts.to_data() if self.artifacts is not None else None
        if self.artifacts is None:
            del raw["artifacts"]  # as records were before the index: any reader takes it
        return json.dumps(raw, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | bytes) -> SummaryRecord:
        raw: Any = json.loads(data)
        if not isinstance(raw, dict):
            raise InvalidTranscript("summary record must be a JSON object")
        index = raw.pop("artifacts", None)
        if index is not None and not isinstance(index, dict):
            raise InvalidTranscript("bad summary record: artifacts must be an object")
        try:
            return cls(**raw, artifacts=ArtifactIndex.from_data(index) if index else None)
        except TypeError as exc:
            raise InvalidTranscript(f"bad summary record: {exc}") from None


@dataclass
class SummaryBook:
    """Summaries known for one conversation (loaded from the store, or made in this process).

    - records: the known records, in any order.
    """

    records: list[SummaryRecord] = field(default_factory=list)

    def best(
        self,
        transcript: Sequence[Message],
        *,
        upto_max: int | None = None,
        hashes: Sequence[str] | None = None,
    ) -> SummaryRecord | None:
        """The summary covering the longest prefix of `transcript` that matches by content.

        - transcript: the conversation's messages;
        - upto_max: the furthest a record may reach (its `upto` at most this; None: the
          transcript's length);
        - hashes: the transcript's precomputed `prefix_hashes`, to avoid hashing it again.
        """
        limit = len(transcript) if upto_max is None else min(upto_max, len(transcript))
        candidates = [r for r in self.records if 0 < r.upto <= limit]
        if not candidates:
            return None
        chain = (
            hashes
            if hashes is not None
            else prefix_hashes(transcript[: max(r.upto for r in candidates)])
        )
        best: SummaryRecord | None = None
        for r in candidates:
            matches = r.upto < len(chain) and chain[r.upto] == r.prefix_hash
            if matches and (best is None or r.upto > best.upto):
                best = r
        return best

    def add(self, record: SummaryRecord) -> None:
        """Remember a record (replacing one for the same prefix)."""
        self.records = [r for r in self.records if r.prefix_hash != record.prefix_hash]
        self.records.append(record)
