"""The prefit.summarize task on an in-process Celery worker, a real Redis broker and a fake LLM."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis
from kombu.connection import Connection

from shared.messages import Message
from shared.service.broker import broker_kind
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE, TASK_NAME
from shared.settings import Settings
from shared.store import Store
from shared.summaries.artifacts import narrative
from shared.summaries.llm import Completion
from shared.summaries.summarizers import build_prompt
from tests.builders import task_chat
from tests.fakellm import Failure, FakeLLM
from tests.worker.helpers import (
    assert_disjoint,
    enqueue,
    job_for,
    policy_of,
    running_worker,
    summarized_range,
    wait_until,
    worker_settings,
)

AppFor = Callable[..., Any]


@pytest.fixture
def settings(redis_url: str, fake: FakeLLM) -> Settings:
    return worker_settings(redis_url, fake)


def test_fifty_triggers_cost_one_llm_call_per_range(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """50 jobs for one conversation at once: one summary, one LLM call, the rest end at once."""
    fake.delay = 0.3  # the holder is mid-call while the duplicates arrive
    msgs = task_chat(30)
    store.conversations.append(tenant, "c1", msgs)
    job = job_for(store, tenant, "c1", model)
    app = app_for(settings)
    with running_worker(app, concurrency=16) as runs:
        ids = [enqueue(app, settings, job) for _ in range(50)]
        outcomes = runs.wait(ids)
    statuses = sorted(o["status"] for o in outcomes)
    assert statuses.count("written") == 1
    assert set(statuses) <= {"written", "busy", "not_due"}
    assert len(fake.calls) == 1 and runs.retried == []
    assert_disjoint([summarized_range(c, msgs) for c in fake.calls])
    assert len(store.records.list(tenant, "c1")) == 1
    assert store.usage.get(tenant).summaries == 1
    assert store.inflight.running(settings.summary_queue) == 0  # none left for a reaper


def test_retry_after_of_a_429_is_honoured(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A 429 asking for more than the inline wait becomes a task retry with that countdown."""
    fake.script(Failure(429, headers={"retry-after": "1.5"}))
    store.conversations.append(tenant, "c1", task_chat(30))
    app = app_for(settings)
    with running_worker(app) as runs:
        task_id = enqueue(app, settings, job_for(store, tenant, "c1", model))
        (outcome,) = runs.wait([task_id])
    assert [r.countdown for r in runs.retried] == [1.5]
    assert outcome["status"] == "written"
    assert [c.status for c in fake.calls] == [429, 200]
    assert store.dead_letters.list(tenant) == []
    assert store.inflight.running(settings.summary_queue) == 0


def test_401_is_dead_lettered_without_retry(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """An authentication failure is not retried: one call, one dead letter, no record."""
    fake.script(Failure(401))
    store.conversations.append(tenant, "c1", task_chat(30, tag="PRIVATE"))
    app = app_for(settings)
    with running_worker(app) as runs:
        task_id = enqueue(app, settings, job_for(store, tenant, "c1", model))
        (outcome,) = runs.wait([task_id])
    assert outcome["status"] == "dead_letter" and runs.retried == []
    assert len(fake.calls) == 1
    (letter,) = store.dead_letters.list(tenant)
    assert (letter.conv_id, letter.task_id, letter.attempts) == ("c1", task_id, 1)
    assert letter.error.startswith("LLMError") and "401" in letter.error
    assert "PRIVATE" not in letter.error
    assert store.records.list(tenant, "c1") == []


def test_context_length_error_leads_to_smaller_chunks(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A range the provider finds too long is summarized again in two halves, folded."""
    msgs = task_chat(30)
    store.conversations.append(tenant, "c1", msgs)
    job = job_for(store, tenant, "c1", model)
    plan = policy_of(store, settings, job).plan_summary(msgs, model=model)
    assert plan is not None
    whole = build_prompt(None, msgs[plan.start : plan.cut], settings.max_summary_tokens)
    fake.context_limit_chars = len(whole) - 1  # the whole range is too long, halves are not
    app = app_for(settings)
    with running_worker(app) as runs:
        (outcome,) = runs.wait([enqueue(app, settings, job)])
    assert outcome["status"] == "written" and outcome["calls"] == 3
    assert [c.status for c in fake.calls] == [400, 200, 200]
    first, second = (summarized_range(c, msgs) for c in fake.calls[1:])
    assert first[0] == plan.start and first[1] == second[0] and second[1] == plan.cut
    record = store.records.best(tenant, "c1")
    assert record is not None and record.upto == plan.cut
    assert narrative(record.text) == fake.answer(fake.calls[2].prompt)


def test_retryable_failures_end_in_a_dead_letter(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A provider failing every attempt is retried max_redeliveries times, then dead-lettered."""
    settings = worker_settings(redis_url, fake, max_redeliveries=2, summarizer_max_attempts=1)
    fake.script(*[Failure(503, headers={"retry-after": "0"})] * 3)
    store.conversations.append(tenant, "c1", task_chat(30))
    app = app_for(settings)
    with running_worker(app) as runs:
        task_id = enqueue(app, settings, job_for(store, tenant, "c1", model))
        (outcome,) = runs.wait([task_id])
    assert outcome["status"] == "dead_letter" and outcome["attempts"] == 3
    assert len(runs.retried) == 2 and len(fake.calls) == 3
    (letter,) = store.dead_letters.list(tenant)
    assert letter.attempts == 3 and "RetryableLLMError" in letter.error and "503" in letter.error
    assert store.records.list(tenant, "c1") == []


class Broken:
    """A summarizer with a bug whose message quotes the conversation."""

    name = "broken"

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        raise RuntimeError(f"cannot handle {messages[0]['content']}")


def test_unexpected_error_is_dead_lettered_without_its_message(
    store: Store, redis_url: str, tenant: str, model: str, app_for: AppFor
) -> None:
    """A crash is retried like any fault; its dead letter names the error type, never content."""
    settings = worker_settings(redis_url, None, max_redeliveries=0)
    store.conversations.append(tenant, "c1", task_chat(30, tag="PRIVATE"))
    app = app_for(settings, Broken())
    with running_worker(app) as runs:
        (outcome,) = runs.wait([enqueue(app, settings, job_for(store, tenant, "c1", model))])
    assert outcome == {"status": "dead_letter", "error": "RuntimeError", "attempts": 1}
    (letter,) = store.dead_letters.list(tenant)
    assert letter.error == "RuntimeError" and "PRIVATE" not in repr(letter)
    assert store.records.list(tenant, "c1") == []


def redeliver(settings: Settings) -> None:
    """Have the queued message flagged as the broker flags one whose worker died: on RabbitMQ
    for real (a consumer takes it and leaves without acking), on Redis as kombu's restore does."""
    if broker_kind(settings.broker) == "amqp":
        with Connection(settings.broker, heartbeat=0) as conn:
            taken = conn.channel().basic_get(settings.summary_queue, no_ack=False)
            assert taken is not None, "no message queued"
        return  # the connection closed with the message unacknowledged: RabbitMQ requeues it
    client = redis.Redis.from_url(settings.broker)
    try:
        raw = client.rpop(settings.summary_queue)
        assert isinstance(raw, bytes), "no message queued"
        message = json.loads(raw)
        message["headers"]["redelivered"] = True
        message["properties"]["delivery_info"]["redelivered"] = True
        client.rpush(settings.summary_queue, json.dumps(message))
    finally:
        client.close()


def test_a_redelivery_counts_as_an_attempt(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A redelivered message is turned into a retry (so it is counted), then runs normally."""
    store.conversations.append(tenant, "c1", task_chat(30))
    app = app_for(settings)
    task_id = enqueue(app, settings, job_for(store, tenant, "c1", model), rank=PRIORITY_STALE)
    redeliver(settings)
    with running_worker(app) as runs:
        (outcome,) = runs.wait([task_id])
    assert [r.countdown for r in runs.retried] == [0.0]
    assert outcome["status"] == "written" and len(fake.calls) == 1


def test_redeliveries_beyond_the_limit_are_dead_lettered(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """With no redeliveries left, a redelivered job is dead-lettered and calls no LLM."""
    settings = worker_settings(redis_url, fake, max_redeliveries=0)
    store.conversations.append(tenant, "c1", task_chat(30))
    app = app_for(settings)
    task_id = enqueue(app, settings, job_for(store, tenant, "c1", model), rank=PRIORITY_STALE)
    redeliver(settings)
    with running_worker(app) as runs:
        (outcome,) = runs.wait([task_id])
    assert outcome["status"] == "dead_letter" and runs.retried == [] and fake.calls == []
    (letter,) = store.dead_letters.list(tenant)
    assert letter.attempts == 1 and "redelivered" in letter.error


def test_malformed_job_is_rejected_without_retry(
    settings: Settings, fake: FakeLLM, tenant: str, app_for: AppFor
) -> None:
    """Task kwargs that make no SummaryJob end the task at once."""
    app = app_for(settings)
    with running_worker(app) as runs:
        result = app.send_task(TASK_NAME, kwargs={"tenant": tenant}, queue=settings.summary_queue)
        (outcome,) = runs.wait([str(result.id)])
    assert outcome["status"] == "dead_letter" and "ConfigError" in outcome["error"]
    assert runs.retried == [] and fake.calls == []


def test_stale_jobs_are_served_before_ahead_of_time_ones(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """A job someone may be waiting for (PRIORITY_STALE) runs before queued background jobs."""
    for conv in ("a", "b", "c"):
        store.conversations.append(tenant, conv, task_chat(4))
    app = app_for(settings)
    ahead = [
        enqueue(app, settings, job_for(store, tenant, c, model), PRIORITY_AHEAD) for c in ("a", "b")
    ]
    stale = enqueue(app, settings, job_for(store, tenant, "c", model), PRIORITY_STALE)
    with running_worker(app, concurrency=1) as runs:
        runs.wait([*ahead, stale])
    assert runs.started[0] == stale


def test_a_stale_job_overtakes_ahead_jobs_queued_while_the_worker_was_busy(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """Prefetch 1: a worker busy with a summary holds no other message, so a stale job sent
    after a batch of ahead-of-time ones is the next it runs; the batch follows in order."""
    fake.delay = 1.0  # the first job is inside its LLM call while the others are sent
    store.conversations.append(tenant, "busy", task_chat(30, tag="busy"))
    waiting = [f"ahead-{i}" for i in range(5)]
    for conv in [*waiting, "stale"]:
        store.conversations.append(tenant, conv, task_chat(4, tag=conv))
    app = app_for(settings)
    with running_worker(app, concurrency=1) as runs:
        first = enqueue(app, settings, job_for(store, tenant, "busy", model), PRIORITY_AHEAD)
        wait_until(lambda: len(fake.calls) == 1, 10, "the worker to be busy")
        ahead = [enqueue(app, settings, job_for(store, tenant, c, model)) for c in waiting]
        stale = enqueue(app, settings, job_for(store, tenant, "stale", model), PRIORITY_STALE)
        runs.wait([first, *ahead, stale])
    assert runs.started == [first, stale, *ahead]
