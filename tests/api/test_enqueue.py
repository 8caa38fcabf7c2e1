"""Enqueueing summary jobs: by name, on the priority lists of Redis or the queue RabbitMQ
declares as the workers do; deduplicated, fail-safe."""

from __future__ import annotations

import json
import time

import pytest
import redis
from kombu.connection import Connection

from api.enqueue import CeleryEnqueue, SummaryTrigger, marker_for, size_step
from shared.commands.redisproc import free_port
from shared.errors import StoreUnavailable
from shared.service.broker import connection_name
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE, SummaryJob
from shared.settings import Settings
from shared.store import Range, Store, keys
from shared.summaries.book import SummaryRecord
from tests.api.conftest import Recorder
from tests.brokerbackend import drop_connections, needs_rabbitmqctl, new_queue
from worker.app import make_app


def job(tenant: str, conv: str = "c1") -> SummaryJob:
    return SummaryJob(tenant, conv, "m", 10_000, 1_000, 4, "v1:" + "ab" * 16)


def test_celery_enqueue_lands_on_the_priority_lists(settings: Settings, tenant: str) -> None:
    """send_task by name puts ahead and stale jobs on the worker queue's priority lists."""
    enqueue = CeleryEnqueue(settings)
    try:
        enqueue(job(tenant), PRIORITY_AHEAD)
        enqueue(job(tenant), PRIORITY_STALE)
    finally:
        enqueue.close()
    client = redis.Redis.from_url(settings.broker)
    lists = keys.broker_queues(settings.summary_queue)
    sizes = {i: client.llen(k) for i, k in enumerate(lists)}
    assert sizes[PRIORITY_AHEAD] == 1 and sizes[PRIORITY_STALE] == 1 and sum(sizes.values()) == 2
    client.delete(*lists)


def test_celery_enqueue_fails_fast_without_a_broker(tenant: str) -> None:
    """No broker: StoreUnavailable within a second or two, not a hang."""
    settings = Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    enqueue = CeleryEnqueue(settings)
    started = time.monotonic()
    try:
        enqueue(job(tenant), PRIORITY_AHEAD)
    except Exception as exc:
        assert type(exc).__name__ == "StoreUnavailable"
    else:
        raise AssertionError("expected StoreUnavailable")
    assert time.monotonic() - started < 5


def test_trigger_claims_once_per_state(store: Store, tenant: str) -> None:
    """One claim per (conversation, kind, record in use, size step); each is a new state."""
    recorder = Recorder()
    claimed: list[str] = []
    trigger = SummaryTrigger(store, recorder, on_claimed=claimed.append)
    first = trigger.claim(job(tenant), "ahead", None, step=40)
    assert first is not None and trigger.claim(job(tenant), "ahead", None, step=40) is None
    assert trigger.claim(job(tenant), "stale", None, step=40) is not None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert trigger.claim(job(tenant), "ahead", record, step=40) is not None
    assert trigger.claim(job(tenant), "ahead", record, step=41) is not None
    assert claimed == ["ahead", "stale", "ahead", "ahead"]
    assert trigger.send(first) is True and recorder.jobs == [(job(tenant), PRIORITY_AHEAD)]


def test_failed_send_frees_the_claim(store: Store, tenant: str) -> None:
    """A send the broker refuses clears its marker, so the next trigger claims again."""
    recorder = Recorder(fail=True)
    sent: list[tuple[str, bool]] = []
    trigger = SummaryTrigger(store, recorder, on_sent=lambda kind, ok: sent.append((kind, ok)))
    claim = trigger.claim(job(tenant), "ahead", None, step=1)
    assert claim is not None and trigger.send(claim) is False
    assert sent == [("ahead", False)]
    assert trigger.claim(job(tenant), "ahead", None, step=1) is not None


def test_a_refused_job_is_kept_for_the_reapers_and_logged_once(
    store: Store, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the broker down, every refused send keeps the conversation's latest job in Redis
    (one entry per conversation) and only the first is logged as `summary.enqueue_failed`."""
    queue = f"q-{tenant}"
    trigger = SummaryTrigger(store, Recorder(fail=True), queue=queue)
    for step in (1, 2, 3):  # the conversation grows while the broker is down
        claim = trigger.claim(job(tenant), "ahead", None, step=step)
        assert claim is not None and trigger.send(claim) is False
    other = trigger.claim(job(tenant, "c2"), "stale", None, step=1)
    assert other is not None and trigger.send(other) is False
    kept = {(j.conversation_id, j.priority) for j in store.unsent.due(queue, 10)}
    assert kept == {("c1", PRIORITY_AHEAD), ("c2", PRIORITY_STALE)}
    said = capsys.readouterr()
    assert (said.out + said.err).count("summary.enqueue_failed") == 2


def test_size_steps_are_five_percent_of_the_budget() -> None:
    """A conversation's size state changes every 5% of the budget."""
    assert [size_step(t, 100_000) for t in (0, 4_999, 5_000, 75_000)] == [0, 0, 1, 15]
    assert marker_for("stale", None, 37) == "stale-none-37"


def test_no_job_is_claimed_for_a_conversation_whose_summary_was_dead_lettered(
    store: Store, tenant: str
) -> None:
    """While its range is blocked, stale prepares of the same state enqueue nothing; a record
    written since (another origin) or another conversation still gets its job."""
    rng = Range("none", 3, "v1:" + "ef" * 16)
    store.blocks.fail(tenant, "c1", rng, "LLMError: HTTP 401", limit=5, permanent=True)
    trigger = SummaryTrigger(store, Recorder())
    for step in (40, 41, 42):  # growing, re-triggered: still the same origin
        assert trigger.claim(job(tenant), "stale", None, step=step) is None
    assert trigger.claim(job(tenant), "ahead", None, step=40) is None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert trigger.claim(job(tenant), "stale", record, step=40) is not None
    assert trigger.claim(job(tenant, "c2"), "stale", None, step=40) is not None


def amqp_settings(amqp_url: str) -> Settings:
    """Settings publishing to RabbitMQ, on a queue of the test's own (deleted after it)."""
    return Settings(broker_url=amqp_url, summary_queue=new_queue(amqp_url))


def declare_as_the_worker(settings: Settings) -> None:
    """Declare the queue the way a starting worker does: its task consumer's declaration."""
    app = make_app(settings)
    try:
        with app.connection_for_read() as conn:
            app.amqp.TaskConsumer(conn).declare()
    finally:
        app.close()


def taken_in_order(settings: Settings) -> list[str]:
    """Take every message off the queue (acknowledged); their conversation ids, in order."""
    ids = []
    with Connection(settings.broker, heartbeat=0) as conn:
        channel = conn.channel()
        while (message := channel.basic_get(settings.summary_queue, no_ack=True)) is not None:
            _args, kwargs, _embed = json.loads(message.body)
            ids.append(kwargs["conversation_id"])
    return ids


def test_the_api_publishes_onto_a_queue_a_worker_declared_first(amqp_url: str, tenant: str) -> None:
    """Worker first, then the API: the same arguments, so no PRECONDITION_FAILED; a stale job
    sent after an ahead one is handed out first (RabbitMQ serves the highest priority first)."""
    settings = amqp_settings(amqp_url)
    declare_as_the_worker(settings)
    enqueue = CeleryEnqueue(settings)
    try:
        for conv in ("ahead-1", "ahead-2"):
            enqueue(job(tenant, conv), PRIORITY_AHEAD)
        enqueue(job(tenant, "stale"), PRIORITY_STALE)
    finally:
        enqueue.close()
    assert taken_in_order(settings) == ["stale", "ahead-1", "ahead-2"]


def test_a_worker_declares_the_queue_the_api_created_first(amqp_url: str, tenant: str) -> None:
    """API first (its publish declares the queue), then a starting worker: no conflict, and
    the job waits for it."""
    settings = amqp_settings(amqp_url)
    enqueue = CeleryEnqueue(settings)
    try:
        enqueue(job(tenant), PRIORITY_AHEAD)
    finally:
        enqueue.close()
    declare_as_the_worker(settings)
    assert taken_in_order(settings) == ["c1"]


def test_a_queue_declared_otherwise_is_refused_as_the_broker_being_unavailable(
    amqp_url: str, tenant: str
) -> None:
    """What agreeing prevents: a queue someone declared with other arguments makes RabbitMQ
    refuse the API's declaration (PRECONDITION_FAILED), and the send fails as unavailable."""
    settings = amqp_settings(amqp_url)
    with Connection(amqp_url, heartbeat=0) as conn:
        conn.channel().queue_declare(
            settings.summary_queue, durable=True, arguments={"x-max-priority": 5}
        )
    enqueue = CeleryEnqueue(settings)
    try:
        with pytest.raises(StoreUnavailable, match="PreconditionFailed"):
            enqueue(job(tenant), PRIORITY_AHEAD)
    finally:
        enqueue.close()


def test_celery_enqueue_fails_fast_without_rabbitmq(tenant: str) -> None:
    """No RabbitMQ where the URL points: StoreUnavailable within a second or two, not a hang."""
    settings = Settings(broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}//")
    enqueue = CeleryEnqueue(settings)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        enqueue(job(tenant), PRIORITY_AHEAD)
    assert time.monotonic() - started < 5


@pytest.mark.slow
@needs_rabbitmqctl
def test_the_api_publishes_again_after_rabbitmq_dropped_its_connection(
    amqp_url: str, tenant: str
) -> None:
    """The publisher's pooled connection closed by the broker: the next send makes a new one
    (one immediate retry) instead of failing."""
    settings = amqp_settings(amqp_url)
    enqueue = CeleryEnqueue(settings)
    try:
        enqueue(job(tenant, "before"), PRIORITY_AHEAD)
        assert drop_connections(connection_name("api")) >= 1
        enqueue(job(tenant, "after"), PRIORITY_AHEAD)
    finally:
        enqueue.close()
    assert taken_in_order(settings) == ["before", "after"]
