"""What a summary job did (`JobOutcome`), and how far it got while it ran (`Progress`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from shared.store import Range

Status = Literal["written", "not_due", "busy", "stale_job", "exists", "blocked", "breaker_open"]
# a round that ends with one of these ends the job
FINAL: frozenset[Status] = frozenset({"not_due", "stale_job", "blocked", "breaker_open"})


@dataclass(frozen=True)
class JobOutcome:
    """What a job did. `status` is the last round's, upgraded by any record written before.

    - written: this job wrote a record (`upto`, `prefix_hash` name the last one);
    - exists: the planned record already existed (another conversation of the tenant with
      the same prefix, or a racing worker): it was linked, no LLM was called;
    - not_due: no record is due (the book already suffices);
    - busy: another worker holds the conversation's lease (`holder`); it will cover this;
    - stale_job: the conversation no longer exists (deleted or expired);
    - blocked: the planned range was dead-lettered lately (`shared.store.blocks`): no call;
    - breaker_open: the summarizer failed permanently lately (`shared.store.breaker`): no call.

    `prefix_changed` says the stored transcript no longer starts with the job's prefix (it
    was replaced or cut): the job was planned on the current transcript anyway.
    """

    status: Status
    upto: int | None = None
    prefix_hash: str | None = None
    records: int = 0
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    prefix_changed: bool = False
    holder: str | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Progress:
    """How far a running job got, for its task to count a failure against (filled in as it runs).

    `range`: the range being summarized when it failed (None: the job failed before it planned
    one, or after it wrote it); `probing`: the job holds its summarizer breaker's probe.
    """

    range: Range | None = None
    probing: bool = False
