"""The reaper: jobs whose worker stopped renewing them are sent again, by name, once."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from shared.errors import LLMError
from shared.service.jobs import PRIORITY_AHEAD
from shared.settings import Settings
from shared.store import Store, Ticket
from tests.brokerbackend import unreachable_broker
from tests.builders import task_chat
from tests.fakellm import FakeLLM
from tests.worker.helpers import job_for, running_worker, wait_until, worker_settings
from worker.app import make_app
from worker.reaper import Reaper
from worker.runtime import Runtime

AppFor = Callable[..., Any]


def test_a_job_left_behind_is_sent_again_and_runs(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """An entry past its deadline (its worker died) is taken, sent with its retries counted,
    and summarized; the registry is empty afterwards."""
    settings = worker_settings(redis_url, fake)
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    ticket = Ticket("lost-task-1", settings.summary_queue, job.to_kwargs(), retries=1)
    store.inflight.register(ticket, 0.01)  # as a dead worker's claim left it
    time.sleep(0.05)
    app = app_for(settings)
    with running_worker(app) as runs:
        assert Reaper(app, store, settings.summary_queue, 60.0).sweep() == 1
        (outcome,) = runs.wait(["lost-task-1"])
    assert outcome["status"] == "written" and len(fake.calls) == 1
    assert store.inflight.running(settings.summary_queue) == 0
    assert Reaper(app, store, settings.summary_queue, 60.0).sweep() == 0


def test_a_job_the_broker_refuses_waits_for_the_next_sweep(
    store: Store, redis_url: str, tenant: str
) -> None:
    """With the broker down the entry goes back to the registry instead of being lost."""
    settings = worker_settings(redis_url, None, broker_url=unreachable_broker())
    ticket = Ticket("lost-task-2", settings.summary_queue, {"tenant": tenant}, retries=0)
    store.inflight.register(ticket, 0.01)
    time.sleep(0.05)
    assert _sweep_with_the_broker_down(store, settings) == 0
    assert store.inflight.running(settings.summary_queue) == 1
    time.sleep(0.25)
    (back,) = store.inflight.reap(settings.summary_queue)
    assert back == ticket  # unchanged: the failed send did not count as an attempt


def test_a_job_lost_too_often_is_dead_lettered_without_calling(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A job whose worker died on it more than max_redeliveries times (a poison job) is
    dead-lettered when it comes back, not run again."""
    settings = worker_settings(redis_url, fake, max_redeliveries=2)
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    ticket = Ticket("lost-task-3", settings.summary_queue, job.to_kwargs(), retries=2)
    store.inflight.register(ticket, 0.01)
    time.sleep(0.05)
    app = app_for(settings)
    with running_worker(app) as runs:
        Reaper(app, store, settings.summary_queue, 60.0).sweep()  # sent as its 3rd retry
        (outcome,) = runs.wait(["lost-task-3"])
    assert outcome["status"] == "dead_letter" and fake.calls == []
    (letter,) = store.dead_letters.list(tenant)
    assert "lost 3 times" in letter.error and letter.attempts == 4
    wait_until(lambda: store.inflight.running(settings.summary_queue) == 0, 5, "no entry left")


def test_jobs_the_api_could_not_send_are_sent_once_the_broker_answers(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A job kept while the broker was down (`Unsent.keep`, as the API does) stays kept while
    the broker refuses it, then the next sweep sends it and a worker summarizes it: no new turn
    needed; nothing is left kept afterwards."""
    settings = worker_settings(redis_url, fake)
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    assert store.unsent.keep(settings.summary_queue, job.to_kwargs(), PRIORITY_AHEAD)
    down = worker_settings(redis_url, None, broker_url=unreachable_broker())
    assert _sweep_with_the_broker_down(store, down, settings.summary_queue) == 0
    assert store.unsent.count(settings.summary_queue) == 1
    app = app_for(settings)
    with running_worker(app):
        assert Reaper(app, store, settings.summary_queue, 60.0).sweep() == 1
        wait_until(lambda: store.records.best(tenant, "c1") is not None, 20, "the summary")
    assert store.unsent.count(settings.summary_queue) == 0 and len(fake.calls) == 1


def _sweep_with_the_broker_down(store: Store, settings: Settings, queue: str = "") -> int:
    """One sweep of `queue` (the settings' by default) by a reaper whose broker never answers."""
    app = make_app(settings)
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}
    try:
        return Reaper(app, store, queue or settings.summary_queue, 0.2).sweep()
    finally:
        app.close()


def test_while_the_broker_is_down_the_reaper_runs_unsent_jobs_itself(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A job kept while the broker refuses it is summarized by the reaper's own worker, on its
    event loop, without waiting for the broker; it is taken out of the unsent index, and a
    second sweep has nothing left to run."""
    down = worker_settings(redis_url, fake, broker_url=unreachable_broker())
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    assert store.unsent.keep(down.summary_queue, job.to_kwargs(), PRIORITY_AHEAD)
    runtime = Runtime(down)
    app = make_app(down)
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}
    try:
        reaper = Reaper(app, store, down.summary_queue, 60.0, runner=runtime.submit)
        assert reaper.sweep() == 0  # nothing reached the broker
        wait_until(lambda: store.records.best(tenant, "c1") is not None, 20, "the summary")
        assert store.unsent.count(down.summary_queue) == 0 and len(fake.calls) == 1
        wait_until(lambda: store.inflight.running(down.summary_queue) == 0, 5, "its entry gone")
        assert reaper.sweep() == 0 and len(fake.calls) == 1
    finally:
        app.close()
        runtime.close()


def test_an_unsent_job_that_fails_here_is_kept_for_the_broker(
    store: Store, redis_url: str, tenant: str, model: str
) -> None:
    """A job the reaper ran itself and that failed is kept again (for the broker and Celery's
    retries once it is back), and the same reaper does not run it again."""
    down = worker_settings(redis_url, None, broker_url=unreachable_broker())
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    assert store.unsent.keep(down.summary_queue, job.to_kwargs(), PRIORITY_AHEAD)
    ran: list[str] = []

    def failing(job: Any, ticket: Ticket) -> Future[Any]:
        ran.append(ticket.task_id)
        failed: Future[Any] = Future()
        failed.set_exception(LLMError("HTTP 401"))
        return failed

    app = make_app(down)
    try:
        reaper = Reaper(app, store, down.summary_queue, 60.0, runner=failing)
        (kept,) = store.unsent.due(down.summary_queue, 10)
        assert reaper.run_here([kept]) == 1
        assert store.unsent.count(down.summary_queue) == 1  # kept again
        (again,) = store.unsent.due(down.summary_queue, 10)
        assert reaper.run_here([again]) == 0 and len(ran) == 1
    finally:
        app.close()
