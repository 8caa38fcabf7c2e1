"""The one Celery task, `prefit.summarize`: a thin shell around `shared.precompute.run_job`.

The task decides only what happens after a failure:

- `RetryableLLMError` (429, 5xx, timeouts): retry with the provider's `retry_after`, else
  exponential backoff with jitter; `StoreUnavailable`, `LeaseLost` and unexpected errors
  retry with backoff too;
- `LLMError` (a 4xx such as 401; also a `ContextLengthExceeded` that halving chunks could
  not cure) and `ConfigError` (a malformed job): a dead letter at once, no retry;
- a message the broker redelivered (its worker died mid-task, acks are late) counts as a
  failed attempt: it is turned into a retry, so `request.retries` counts redeliveries too.

After `max_redeliveries` retries the task writes a dead letter (error text and attempts,
never content) and stops. Countdowns stay under half the visibility timeout: a retry waits
unacknowledged in the worker, and waiting longer would make the broker hand it out again.
"""

from __future__ import annotations

import random
import time
import traceback
import uuid
from typing import Any

import structlog

from shared.errors import (
    ConfigError,
    LeaseLost,
    LLMError,
    PrefitError,
    RetryableLLMError,
    StoreUnavailable,
)
from shared.jobs import TASK_NAME, SummaryJob
from shared.logs import get_logger
from shared.precompute import Outcome, run_job
from worker.runtime import Runtime

BACKOFF_BASE_S = 2.0
BACKOFF_MAX_S = 300.0

log = get_logger(__name__)


def register(app: Any, runtime: Runtime) -> Any:
    """Register `prefit.summarize` on `app`, running its jobs with `runtime`."""

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_NAME,
        bind=True,
        max_retries=runtime.settings.max_redeliveries,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        shared=False,  # each app runs its own runtime's jobs (tests hold several apps)
    )
    def summarize(self: Any, **kwargs: Any) -> dict[str, Any]:
        with structlog.contextvars.bound_contextvars(task_id=self.request.id):
            return handle(self, runtime, kwargs)

    return summarize


def handle(task: Any, runtime: Runtime, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run one delivery of the task; returns the outcome as a dict (logged, never stored)."""
    request = task.request
    attempt = int(request.retries) + 1
    try:
        job = SummaryJob.from_kwargs(kwargs)
    except ConfigError as exc:
        return _dead(task, runtime, None, exc, attempt)
    if (request.delivery_info or {}).get("redelivered"):
        log.warning("summary.task_redelivered", attempt=attempt, **_ids(job))
        return _again(task, runtime, job, None, countdown=0.0, reason="redelivered")
    started = time.perf_counter()
    try:
        outcome = runtime.run(
            run_job(
                job,
                store=runtime.store,
                summarizer=runtime.summarizer,
                settings=runtime.settings,
                owner=f"{request.id}/{uuid.uuid4().hex[:8]}",
            )
        )
    except RetryableLLMError as exc:
        wait = exc.retry_after if exc.retry_after is not None else _backoff(attempt)
        return _again(task, runtime, job, exc, countdown=wait, reason="llm_retryable")
    except LLMError as exc:  # a 4xx, or a context error smaller chunks could not cure
        return _dead(task, runtime, job, exc, attempt)
    except ConfigError as exc:
        return _dead(task, runtime, job, exc, attempt)
    except (LeaseLost, StoreUnavailable) as exc:
        return _again(task, runtime, job, exc, countdown=_backoff(attempt), reason=_name(exc))
    except Exception as exc:  # a bug or an unforeseen fault: retried, then dead-lettered
        # where it failed, not the traceback: an exception's message may quote content
        log.error("summary.task_crashed", error=_name(exc), at=_where(exc), **_ids(job))
        return _again(task, runtime, job, exc, countdown=_backoff(attempt), reason="crashed")
    if outcome.status == "busy" and _own(outcome, request.id):
        # An earlier delivery of this very task holds the lease: it died (the lease will
        # expire) or still runs past the visibility timeout. Come back once either is over.
        wait = runtime.settings.lease_ttl_s
        return _again(task, runtime, job, None, countdown=wait, reason="own_lease")
    _finished(job, outcome, attempt, started)
    return outcome.to_dict()


def _again(
    task: Any,
    runtime: Runtime,
    job: SummaryJob,
    exc: BaseException | None,
    *,
    countdown: float,
    reason: str,
) -> dict[str, Any]:
    """Retry later, or dead-letter once the retries are spent."""
    attempt = int(task.request.retries) + 1
    limit = runtime.settings.max_redeliveries
    if task.request.retries >= limit:
        final = exc if exc is not None else PrefitError(f"gave up: {reason}")
        return _dead(task, runtime, job, final, attempt)
    wait = max(0.0, min(countdown, runtime.settings.visibility_timeout_s / 2))
    log.info(
        "summary.task_retried",
        reason=reason,
        error=_error_text(exc) if exc is not None else None,
        attempt=attempt,
        countdown=round(wait, 3),
        **_ids(job),
    )
    raise task.retry(countdown=wait, max_retries=limit)


def _dead(
    task: Any, runtime: Runtime, job: SummaryJob | None, exc: BaseException, attempts: int
) -> dict[str, Any]:
    """Write a dead letter (error text and attempts, no content) and end the task."""
    error = _error_text(exc)
    task_id = str(task.request.id)
    if job is None:
        log.error("summary.job_rejected", error=error, attempts=attempts)
        return {"status": "dead_letter", "error": error, "attempts": attempts}
    try:
        runtime.store.dead_letters.add(job.tenant, job.conversation_id, task_id, error, attempts)
    except (StoreUnavailable, ConfigError):  # Redis down, or ids no key can be built from
        log.error("summary.dead_letter_failed", error=error, attempts=attempts, **_ids(job))
    else:
        log.error("summary.dead_lettered", error=error, attempts=attempts, **_ids(job))
    return {"status": "dead_letter", "error": error, "attempts": attempts}


def _finished(job: SummaryJob, outcome: Outcome, attempt: int, started: float) -> None:
    ms = round((time.perf_counter() - started) * 1000, 1)
    log.info("summary.task_finished", attempt=attempt, ms=ms, **outcome.to_dict(), **_ids(job))


def _own(outcome: Outcome, task_id: str | None) -> bool:
    holder = outcome.holder or ""
    return task_id is not None and holder.split("/", 1)[0] == task_id


def _backoff(attempt: int) -> float:
    """Exponential backoff with jitter: ~2 s, 4 s, 8 s ... capped at 5 minutes."""
    ceiling: float = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + random.random() / 2)


def _error_text(exc: BaseException) -> str:
    # Our own errors are written never to carry content; anything else may (a KeyError on a
    # message field, say), so only its type is kept.
    if isinstance(exc, PrefitError):
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _ids(job: SummaryJob) -> dict[str, Any]:
    return {
        "tenant": job.tenant,
        "conversation_id": job.conversation_id,
        "job_length": job.length,
        "job_prefix_hash": job.prefix_hash,
    }
