"""The one Celery task, `prefit.summarize`: a thin shell around `shared.service.precompute.run_job`.

The task decides only what happens after a failure, as `shared.service.failures` says: retry after a
backoff (the provider's `retry_after` for a 429), dead-letter (a permanent error, or a
range's attempts spent), or end quietly (another job blocked the range meanwhile). A
message the broker redelivered (its worker died mid-task, acks are late) counts as a failed
attempt: it is turned into a retry, so `request.retries` counts redeliveries too; so does a
job the reaper sent again (`worker.reaper`), which arrives with its retries counted.

Each delivery has an in-flight entry (`shared.store.inflight`): registered and removed with
the conversation's lease inside `run_job`, pushed back by the countdown when the task
retries, removed when it ends otherwise. Dead letters carry error text and attempts, never
content. Countdowns stay under half the visibility timeout: a retry waits unacknowledged in
the worker, and waiting longer would make the broker hand it out again.
"""

from __future__ import annotations

import time
import traceback
import uuid
from typing import Any

import structlog
from celery.exceptions import Retry

from shared.errors import ConfigError, PrefitError, StoreUnavailable
from shared.logs import get_logger
from shared.service.failures import Decision, error_text
from shared.service.jobs import TASK_NAME, SummaryJob
from shared.service.precompute import JobOutcome, Progress, run_job
from shared.store import Ticket
from worker.runtime import Runtime

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
        runtime.start_reaper(app)  # the command-line worker starts it when ready already
        metrics = runtime.metrics
        with structlog.contextvars.bound_contextvars(task_id=self.request.id), metrics.delivery():
            started = time.perf_counter()
            try:
                result = handle(self, runtime, kwargs)
            except Retry:
                metrics.left("retried", time.perf_counter() - started)
                raise
            except BaseException:
                metrics.left("crashed", time.perf_counter() - started)
                raise
            metrics.ended(result, time.perf_counter() - started)
            return result

    return summarize


def handle(task: Any, runtime: Runtime, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run one delivery of the task; returns the outcome as a dict (logged, never stored)."""
    request = task.request
    attempt = int(request.retries) + 1
    try:
        job = SummaryJob.from_kwargs(kwargs)
    except ConfigError as exc:
        return _dead(task, runtime, None, None, exc, attempt)
    ticket = Ticket(str(request.id), runtime.settings.summary_queue, kwargs, int(request.retries))
    if request.retries > runtime.settings.max_redeliveries:  # sent again by reapers, too often
        gave_up = PrefitError(f"gave up: its worker was lost {request.retries} times")
        return _dead(task, runtime, job, ticket, gave_up, attempt)
    if (request.delivery_info or {}).get("redelivered"):
        log.warning("summary.task_redelivered", attempt=attempt, **_ids(job))
        return _again(task, runtime, job, ticket, None, countdown=0.0, reason="redelivered")
    started = time.perf_counter()
    progress = Progress()
    try:
        outcome = _run(runtime, job, ticket, progress)
    except Exception as exc:  # what comes next is for shared.service.failures to say
        if not isinstance(exc, PrefitError):  # a bug or an unforeseen fault: where, not what
            log.error("summary.task_crashed", error=_name(exc), at=_where(exc), **_ids(job))
        decision = runtime.failures.decide(job, progress, exc, retries=int(request.retries))
        return _act(task, runtime, job, ticket, exc, decision)
    if outcome.status == "busy" and _own(outcome, request.id):
        # An earlier delivery of this very task holds the lease: it still runs (a broker
        # connection lost, a run past the visibility timeout) or it died. Its in-flight entry
        # is the same as ours: renewed with the lease while it runs, sent again by a reaper
        # once the lease lapses. So this copy ends, without a retry that could run out the
        # budget while a long summary still runs, and leaves the entry to its holder.
        log.info("summary.left_to_holder", **_ids(job))
        _finished(job, outcome, attempt, started)
        return outcome.to_dict()
    if outcome.status == "busy":  # the holder covers it; nothing of this job is left to resend
        _leave(runtime, ticket)
    _finished(job, outcome, attempt, started)
    return outcome.to_dict()


def _run(runtime: Runtime, job: SummaryJob, ticket: Ticket, progress: Progress) -> JobOutcome:
    return runtime.run(
        run_job(
            job,
            store=runtime.store,
            summarizer=runtime.summarizer,
            settings=runtime.settings,
            owner=f"{ticket.task_id}/{uuid.uuid4().hex[:8]}",
            ticket=ticket,
            provider=runtime.provider,
            progress=progress,
        )
    )


def _act(
    task: Any,
    runtime: Runtime,
    job: SummaryJob,
    ticket: Ticket,
    exc: BaseException,
    decision: Decision,
) -> dict[str, Any]:
    if decision.action == "retry":
        return _again(
            task, runtime, job, ticket, exc, countdown=decision.countdown, reason=_name(exc)
        )
    if decision.action == "dead_letter":
        return _dead(task, runtime, job, ticket, exc, decision.attempts)
    _leave(runtime, ticket)  # drop: another job blocked the range meanwhile
    return {"status": "blocked", "error": error_text(exc), "attempts": decision.attempts}


def _again(
    task: Any,
    runtime: Runtime,
    job: SummaryJob,
    ticket: Ticket,
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
        return _dead(task, runtime, job, ticket, final, attempt)
    wait = max(0.0, min(countdown, runtime.settings.visibility_timeout_s / 2))
    runtime.metrics.retrying(reason)
    log.info(
        "summary.task_retried",
        reason=reason,
        error=error_text(exc) if exc is not None else None,
        attempt=attempt,
        countdown=round(wait, 3),
        **_ids(job),
    )
    try:  # should the worker holding the retry die, the reaper sends it once it is due
        runtime.store.inflight.defer(ticket, wait, runtime.settings.lease_ttl_s)
    except StoreUnavailable:
        log.warning("summary.inflight_unavailable", **_ids(job))
    raise task.retry(countdown=wait, max_retries=limit)


def _dead(
    task: Any,
    runtime: Runtime,
    job: SummaryJob | None,
    ticket: Ticket | None,
    exc: BaseException,
    attempts: int,
) -> dict[str, Any]:
    """Write a dead letter (error text and attempts, no content) and end the task."""
    error = error_text(exc)
    task_id = str(task.request.id)
    if job is None:
        log.error("summary.job_rejected", error=error, attempts=attempts)
        return {"status": "dead_letter", "error": error, "attempts": attempts}
    if ticket is not None:
        _leave(runtime, ticket)
    try:
        runtime.store.dead_letters.add(job.tenant, job.conversation_id, task_id, error, attempts)
    except (StoreUnavailable, ConfigError):  # Redis down, or ids no key can be built from
        log.error("summary.dead_letter_failed", error=error, attempts=attempts, **_ids(job))
    else:
        log.error("summary.dead_lettered", error=error, attempts=attempts, **_ids(job))
    return {"status": "dead_letter", "error": error, "attempts": attempts}


def _leave(runtime: Runtime, ticket: Ticket) -> None:
    try:
        runtime.store.inflight.leave(ticket)
    except StoreUnavailable:  # the reaper will send it once more: a harmless duplicate
        log.warning("summary.inflight_unavailable", task_id=ticket.task_id)


def _finished(job: SummaryJob, outcome: JobOutcome, attempt: int, started: float) -> None:
    ms = round((time.perf_counter() - started) * 1000, 1)
    log.info("summary.task_finished", attempt=attempt, ms=ms, **outcome.to_dict(), **_ids(job))


def _own(outcome: JobOutcome, task_id: str | None) -> bool:
    holder = outcome.holder or ""
    return task_id is not None and holder.split("/", 1)[0] == task_id


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
