"""Scheduling summary jobs: when (ahead after a write, stale at a prepare); by name, on the
priority lists of Redis or the queue RabbitMQ declares as the workers do; deduplicated,
fail-safe."""

from __future__ import annotations

import json
import time

import pytest
import redis
from kombu.connection import Connection

from api.policies import Window
from api.schedule import CeleryEnqueue, JobScope, Scheduler, marker_for, size_step
from shared.commands.redisproc import free_port
from shared.errors import StoreUnavailable
from shared.messages import ToolSpec
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


def test_a_state_is_scheduled_once(store: Store, tenant: str) -> None:
    """One job per (conversation, kind, record in use, size step); each is a new state."""
    recorder = Recorder()
    scheduled: list[str] = []
    scheduler = Scheduler(store, recorder, on_scheduled=scheduled.append)
    first = scheduler.schedule(job(tenant), "ahead", None, step=40)
    assert first is not None and scheduler.schedule(job(tenant), "ahead", None, step=40) is None
    assert scheduler.schedule(job(tenant), "stale", None, step=40) is not None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert scheduler.schedule(job(tenant), "ahead", record, step=40) is not None
    assert scheduler.schedule(job(tenant), "ahead", record, step=41) is not None
    assert scheduled == ["ahead", "stale", "ahead", "ahead"]
    assert scheduler.send(first) is True and recorder.jobs == [(job(tenant), PRIORITY_AHEAD)]


def test_failed_send_frees_the_state(store: Store, tenant: str) -> None:
    """A send the broker refuses clears its marker, so the next trigger schedules again."""
    recorder = Recorder(fail=True)
    sent: list[tuple[str, bool]] = []
    scheduler = Scheduler(store, recorder, on_sent=lambda kind, ok: sent.append((kind, ok)))
    pending = scheduler.schedule(job(tenant), "ahead", None, step=1)
    assert pending is not None and scheduler.send(pending) is False
    assert sent == [("ahead", False)]
    assert scheduler.schedule(job(tenant), "ahead", None, step=1) is not None


def test_a_refused_job_is_kept_for_the_reapers_and_logged_once(
    store: Store, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the broker down, every refused send keeps the conversation's latest job in Redis
    (one entry per conversation) and only the first is logged as `summary.enqueue_failed`."""
    queue = f"q-{tenant}"
    scheduler = Scheduler(store, Recorder(fail=True), queue=queue)
    for step in (1, 2, 3):  # the conversation grows while the broker is down
        pending = scheduler.schedule(job(tenant), "ahead", None, step=step)
        assert pending is not None and scheduler.send(pending) is False
    other = scheduler.schedule(job(tenant, "c2"), "stale", None, step=1)
    assert other is not None and scheduler.send(other) is False
    kept = {(j.conversation_id, j.priority) for j in store.unsent.due(queue, 10)}
    assert kept == {("c1", PRIORITY_AHEAD), ("c2", PRIORITY_STALE)}
    said = capsys.readouterr()
    assert (said.out + said.err).count("summary.enqueue_failed") == 2


WINDOW = Window("m", 10_000, 1_000)  # budget 9000
TOOL: ToolSpec = {"name": "read_file", "description": "Read a file.", "parameters": {}}


def scope(tenant: str, length: int = 4) -> JobScope:
    return JobScope(tenant, "c1", WINDOW, length, "v1:" + "ab" * 16, [TOOL])


def test_a_write_schedules_ahead_once_the_conversation_nears_the_trigger(
    store: Store, tenant: str
) -> None:
    """Under the trigger nothing; nearing or over, an ahead job for this scope (its tool specs
    counted), once per size step."""
    scheduler = Scheduler(store, Recorder())
    assert scheduler.ahead(scope(tenant), "under", 6_000, 9_000, None) is None
    first = scheduler.ahead(scope(tenant), "nearing", 6_800, 9_000, None)
    assert first is not None and first.kind == "ahead" and first.marker == "ahead-none-15"
    assert (first.job.length, first.job.max_input_tokens, first.job.model) == (4, 10_000, "m")
    assert first.job.extra_tokens > 0  # the tool spec the job's prompt carries
    assert scheduler.ahead(scope(tenant, 5), "nearing", 6_900, 9_000, None) is None  # same step
    assert scheduler.ahead(scope(tenant, 6), "over", 7_300, 9_000, None) is not None  # next step


def test_a_prepare_schedules_stale_only_when_its_report_says_so(store: Store, tenant: str) -> None:
    """A report not stale schedules nothing; a stale one a high-priority job at its size."""
    recorder = Recorder()
    scheduler = Scheduler(store, recorder)
    report = {"stale": False, "tokens_before": 8_000, "budget": 9_000}
    assert scheduler.stale(scope(tenant), report, None) is None
    pending = scheduler.stale(scope(tenant), {**report, "stale": True}, None)
    assert pending is not None and pending.marker == "stale-none-17"
    scheduler.send_all([pending])
    assert recorder.jobs == [(pending.job, PRIORITY_STALE)]


def test_without_redis_nothing_is_scheduled_and_the_caller_goes_on(
    tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A marker Redis cannot set schedules nothing (no job sent twice later) and says so."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: standalone whatever the pass
    settings = Settings(redis_url=url, redis_cluster=False, redis_socket_timeout_s=0.2)
    down = Store.from_url(settings.redis_url, settings, connect_timeout=0.2)
    recorder = Recorder()
    scheduler = Scheduler(down, recorder)
    assert scheduler.ahead(scope(tenant), "over", 8_000, 9_000, None) is None
    with pytest.raises(StoreUnavailable):
        scheduler.schedule(job(tenant), "stale", None, step=1)
    said = capsys.readouterr()
    assert "summary.schedule_failed" in said.out + said.err and recorder.jobs == []


def test_size_steps_are_five_percent_of_the_budget() -> None:
    """A conversation's size state changes every 5% of the budget."""
    assert [size_step(t, 100_000) for t in (0, 4_999, 5_000, 75_000)] == [0, 0, 1, 15]
    assert marker_for("stale", None, 37) == "stale-none-37"


def test_no_job_is_scheduled_for_a_conversation_whose_summary_was_dead_lettered(
    store: Store, tenant: str
) -> None:
    """While its range is blocked, stale prepares of the same state enqueue nothing; a record
    written since (another origin) or another conversation still gets its job."""
    rng = Range("none", 3, "v1:" + "ef" * 16)
    store.blocks.fail(tenant, "c1", rng, "LLMError: HTTP 401", limit=5, permanent=True)
    scheduler = Scheduler(store, Recorder())
    for step in (40, 41, 42):  # growing, re-triggered: still the same origin
        assert scheduler.schedule(job(tenant), "stale", None, step=step) is None
    assert scheduler.schedule(job(tenant), "ahead", None, step=40) is None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert scheduler.schedule(job(tenant), "stale", record, step=40) is not None
    assert scheduler.schedule(job(tenant, "c2"), "stale", None, step=40) is not None


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
