"""The summary job: what the API enqueues (by task name) and the workers run.

A job carries ids, hashes and sizes only, never message text: the worker reads the
transcript from the store and checks it is still the one the job was made for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shared.errors import ConfigError

TASK_NAME = "prefit.summarize"
# Ranks, 0 served first: `shared.service.broker.priority` turns them into the broker's priorities
# (the same numbers on Redis, which pops the lowest first; reversed on RabbitMQ)
PRIORITY_STALE = 0  # prepare found it due and not ready: someone may be waiting
PRIORITY_AHEAD = 6  # a summary computed ahead of time


@dataclass(frozen=True)
class SummaryJob:
    """Compute the next summary record of one conversation, if one is due."""

    tenant: str
    conversation_id: str
    model: str
    max_input_tokens: int
    reserve_output: int
    length: int  # transcript length the job was planned on
    prefix_hash: str  # hash of those `length` messages, to detect replaced transcripts
    extra_tokens: int = 0  # the request's tool specs, which the stored transcript lacks

    def to_kwargs(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> SummaryJob:
        try:
            job = cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"malformed summary job: {exc}") from None
        if job.max_input_tokens <= job.reserve_output or job.length < 0 or job.extra_tokens < 0:
            raise ConfigError("summary job has an impossible window or length")
        return job
