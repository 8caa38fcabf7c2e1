"""What a summary job's failure leads to: a retry, a dead letter, or nothing more.

- A permanent provider error (an `LLMError` that is not retryable: 401, 403, 404, another 4xx,
  an answer that is not JSON, a chunk within `chunk_tokens` refused as too long) opens the
  summarizer's breaker (`shared.store.breaker`): every job would fail the same way. It is
  dead-lettered at once, and its range blocked (`shared.store.blocks`).
- `RangeTooLong` (one turn group too long for the summarizer) and `ConfigError` (a malformed
  job or range) are the range's own: dead-lettered at once and blocked, no breaker.
- Anything else (`RetryableLLMError`, `LeaseLost`, `StoreUnavailable`, a bug) counts against
  the range's budget, shared by every job and retry planning it: the failure that spends it is
  dead-lettered and blocks the range; earlier ones retry after a backoff. So a hung provider
  ends in one dead letter after `max_redeliveries + 1` timed-out attempts, however many jobs
  asked for that summary meanwhile.
- A failure before the job planned a range counts against the task's own retries (Celery's).
- A range another job has blocked meanwhile ends the job quietly (`drop`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from shared.errors import (
    ConfigError,
    LLMError,
    PrefitError,
    RangeTooLong,
    RetryableLLMError,
    StoreUnavailable,
)
from shared.logs import get_logger
from shared.service.jobs import SummaryJob
from shared.service.precompute import Progress
from shared.settings import Settings
from shared.store import Store

BACKOFF_BASE_S = 2.0
BACKOFF_MAX_S = 300.0

Action = Literal["retry", "dead_letter", "drop"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Decision:
    """What the task does next; `attempts`: failed attempts so far (the range's, or the task's)."""

    action: Action
    attempts: int
    countdown: float = 0.0


def error_text(exc: BaseException) -> str:
    """An error as dead letters and logs may show it: never content.

    Our own errors are written never to carry content; anything else may (a KeyError on a
    message field, say), so only its type is kept.
    """
    if isinstance(exc, PrefitError):
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__


def backoff(attempt: int) -> float:
    """Exponential backoff with jitter: ~2 s, 4 s, 8 s ... capped at 5 minutes."""
    ceiling: float = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + random.random() / 2)


def is_permanent(exc: BaseException) -> bool:
    """A failure that would happen again on any retry."""
    return isinstance(exc, ConfigError | LLMError) and not isinstance(exc, RetryableLLMError)


def is_provider_fault(exc: BaseException) -> bool:
    """A permanent failure of the provider (or of its configuration), not of the range."""
    return isinstance(exc, LLMError) and is_permanent(exc) and not isinstance(exc, RangeTooLong)


class Failures:
    """Decides, and records in Redis, what each failure of a job leads to."""

    def __init__(self, store: Store, settings: Settings, provider: str | None, label: str) -> None:
        self._store, self._settings = store, settings
        self._provider, self._label = provider, label

    def decide(
        self, job: SummaryJob, progress: Progress, exc: BaseException, *, retries: int
    ) -> Decision:
        """Record the failure of one delivery of `job` (retried `retries` times before)."""
        ids = {"tenant": job.tenant, "conversation_id": job.conversation_id}
        permanent = is_permanent(exc)
        self._breaker(exc, progress, ids)
        rng = progress.range
        if rng is None:  # failed before it planned a range, or after writing it
            return Decision("dead_letter", retries + 1) if permanent else self._own(exc, retries)
        limit = self._settings.max_redeliveries
        try:
            failure = self._store.blocks.fail(
                job.tenant,
                job.conversation_id,
                rng,
                error_text(exc),
                limit=limit,
                permanent=permanent,
            )
        except (StoreUnavailable, ConfigError):
            return Decision("dead_letter", retries + 1) if permanent else self._own(exc, retries)
        if failure.attempts < 0:
            log.info("summary.range_blocked_already", **ids, upto=rng.upto)
            return Decision("drop", retries + 1)
        if failure.blocked_s > 0:
            log.warning(
                "summary.range_blocked",
                **ids,
                origin=rng.origin,
                upto=rng.upto,
                prefix_hash=rng.prefix_hash,
                attempts=failure.attempts,
                seconds=failure.blocked_s,
            )
            return Decision("dead_letter", failure.attempts)
        return self._own(exc, retries, attempts=failure.attempts)

    def _own(self, exc: BaseException, retries: int, attempts: int | None = None) -> Decision:
        """Retry after a backoff unless the task's own retries are spent."""
        if retries >= self._settings.max_redeliveries:
            return Decision("dead_letter", retries + 1)
        wait = exc.retry_after if isinstance(exc, RetryableLLMError) else None
        countdown = wait if wait is not None else backoff(retries + 1)
        return Decision("retry", attempts if attempts is not None else retries + 1, countdown)

    def _breaker(self, exc: BaseException, progress: Progress, ids: dict[str, str]) -> None:
        """Open the breaker on a provider fault; a probe that failed otherwise lets another try."""
        if self._provider is None:
            return
        try:
            if is_provider_fault(exc):
                state, opened = self._store.breakers.trip(
                    self._provider, self._label, error_text(exc)
                )
                log.error(
                    "summarizer.breaker_opened" if opened else "summarizer.breaker_failed_open",
                    **ids,
                    provider=self._label,
                    failures=state.failures,
                    until=state.until,
                    error=error_text(exc),
                )
            elif progress.probing:
                self._store.breakers.release_probe(self._provider)
        except StoreUnavailable:
            log.warning("summarizer.breaker_unavailable", **ids, provider=self._label)
        progress.probing = False
