"""Helpers of the worker tests: settings, jobs, task runs, summarized ranges."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun, task_prerun, task_retry
from celery.worker import state

from shared.messages import Message
from shared.policy import ContextPolicy
from shared.service.broker import priority
from shared.service.jobs import PRIORITY_AHEAD, TASK_NAME, SummaryJob
from shared.service.precompute import counter_for, policy_for
from shared.settings import Settings
from shared.store import Store
from shared.summaries.summarizers import render
from tests.brokerbackend import broker_for_tests, new_queue
from tests.fakellm import Call, FakeLLM

SUMMARIZER_MODEL = "fake-summarizer"
# budget 3500: `task_chat(30)` is over the trigger, `task_chat(4)` under
WINDOW, RESERVE = 4000, 500


def worker_settings(redis_url: str, fake: FakeLLM | None, **overrides: Any) -> Settings:
    """Settings of a worker on the suite's Redis, on a queue no other test uses, on the broker
    PREFIT_TEST_BROKER chooses (`tests.brokerbackend`: that Redis, or RabbitMQ)."""
    broker = overrides.get("broker_url", broker_for_tests())
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "broker_url": broker,
        "summarizer_url": fake.base_url if fake is not None else None,
        "summarizer_model": SUMMARIZER_MODEL,
        "summary_queue": new_queue(broker),
        "retention_s": 3600,
        "lease_ttl_s": 5.0,
        "summarizer_max_attempts": 2,
        "summarizer_max_inline_wait_s": 0.05,
        "worker_concurrency": 8,
        "max_redeliveries": 3,
        "chunk_tokens": 24000,
    }
    values.update(overrides)
    return Settings(**values)


def model_name() -> str:
    """A model name no other test uses."""
    return f"model-{uuid.uuid4().hex[:10]}"


def job_for(
    store: Store,
    tenant: str,
    conv_id: str,
    model: str,
    *,
    window: int = WINDOW,
    reserve: int = RESERVE,
) -> SummaryJob:
    """The job the API would enqueue for the stored conversation as it is now."""
    hashes = store.conversations.hashes(tenant, conv_id)
    return SummaryJob(tenant, conv_id, model, window, reserve, len(hashes) - 1, hashes[-1])


def policy_of(store: Store, settings: Settings, job: SummaryJob) -> ContextPolicy:
    """The policy the worker builds for `job` (same counter, same thresholds)."""
    return policy_for(job, settings, counter_for(store, job.tenant, job.model))


def enqueue(app: Any, settings: Settings, job: SummaryJob, rank: int = PRIORITY_AHEAD) -> str:
    """Send the task by name at a priority rank (0 first), as the API does; returns its id."""
    result = app.send_task(
        TASK_NAME,
        kwargs=job.to_kwargs(),
        queue=settings.summary_queue,
        priority=priority(rank, settings.broker),
    )
    return str(result.id)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


@dataclass(frozen=True)
class Retried:
    task_id: str
    countdown: float | None


class TaskRuns:
    """Every run of one app's tasks in this process, as Celery's signals report them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self.started: list[str] = []
        self.finished: dict[str, dict[str, Any]] = {}
        self.retried: list[Retried] = []

    def _ours(self, sender: Any) -> bool:
        return getattr(sender, "app", None) is self.app

    def on_prerun(self, sender: Any = None, task_id: str = "", **_: Any) -> None:
        if self._ours(sender):
            with self._lock:
                self.started.append(task_id)

    def on_postrun(
        self, sender: Any = None, task_id: str = "", retval: Any = None, state: str = "", **_: Any
    ) -> None:
        if self._ours(sender) and state == "SUCCESS":
            with self._lock:
                self.finished[task_id] = dict(retval)

    def on_retry(
        self, sender: Any = None, request: Any = None, reason: Any = None, **_: Any
    ) -> None:
        if self._ours(sender):
            when = getattr(reason, "when", None)
            with self._lock:
                self.retried.append(
                    Retried(str(request.id), when if isinstance(when, int | float) else None)
                )

    def wait(self, task_ids: Sequence[str], timeout: float = 30.0) -> list[dict[str, Any]]:
        """The final outcomes of `task_ids`, once every one of them has finished."""
        wait_until(
            lambda: all(t in self.finished for t in task_ids),
            timeout,
            f"{len(task_ids)} tasks to finish",
        )
        with self._lock:
            return [self.finished[t] for t in task_ids]


@contextmanager
def running_worker(app: Any, concurrency: int = 8) -> Iterator[TaskRuns]:
    """An in-process Celery worker (threads pool) on the app's broker, and its task runs."""
    runs = TaskRuns(app)
    task_prerun.connect(runs.on_prerun, weak=False)
    task_postrun.connect(runs.on_postrun, weak=False)
    task_retry.connect(runs.on_retry, weak=False)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=30,
        ) as worker:
            try:
                yield runs
            finally:
                stop_promptly(worker)
    finally:
        task_prerun.disconnect(runs.on_prerun)
        task_postrun.disconnect(runs.on_postrun)
        task_retry.disconnect(runs.on_retry)


def stop_promptly(worker: Any) -> None:
    """Ask an in-process worker to stop, and wake its event loop to see it: on RabbitMQ the
    loop sleeps until its next timer, up to 10 s (on Redis, BRPOP wakes it every second)."""
    state.should_terminate = 0  # what start_worker sets when its block ends
    hub = getattr(worker, "hub", None)
    if hub is not None:
        hub.call_soon(lambda: None)


def new_messages_of(call: Call) -> str:
    """The `<new_messages>` section of a summarizer prompt the fake received."""
    body = call.prompt.split("<new_messages>\n", 1)[1]
    return body.rsplit("\n</new_messages>", 1)[0]


def summarized_range(call: Call, transcript: Sequence[Message]) -> tuple[int, int]:
    """The message range [i, j) of `transcript` whose rendering the call's prompt carries."""
    section = new_messages_of(call)
    rendered = [render([m]) for m in transcript]
    found = []
    for i in range(len(transcript)):
        if not section.startswith(rendered[i]):
            continue
        for j in range(i + 1, len(transcript) + 1):
            if "\n\n".join(rendered[i:j]) == section:
                found.append((i, j))
                break
    assert len(found) == 1, f"prompt matches {len(found)} message ranges"
    return found[0]


def assert_disjoint(ranges: Sequence[tuple[int, int]]) -> None:
    """No message index lies in two ranges."""
    ordered = sorted(ranges)
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert end <= start, f"ranges overlap: {ordered}"
