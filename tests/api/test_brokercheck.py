"""The broker as /readyz and /metrics see it, on Redis and on RabbitMQ: up or not, queue depth."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.brokercheck import AmqpBroker, RedisBroker, broker_check
from api.schedule import CeleryEnqueue
from shared.commands.redisproc import free_port
from shared.service.broker import connection_name
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE, SummaryJob
from shared.settings import Settings
from shared.store import keys
from shared.store.client import connect
from tests.api.conftest import Recorder, make_settings
from tests.brokerbackend import drop_connections, needs_rabbitmqctl, new_queue


def publish(settings: Settings, tenant: str, ranks: list[int]) -> None:
    """Publish one job per rank, as the API does."""
    enqueue = CeleryEnqueue(settings)
    try:
        for i, rank in enumerate(ranks):
            enqueue(SummaryJob(tenant, f"c{i}", "m", 10_000, 1_000, 4, "v1:" + "ab" * 16), rank)
    finally:
        enqueue.close()


def on_rabbitmq(redis_url: str, model: str, amqp_url: str) -> Settings:
    """API settings with the store on the suite's Redis and the queue on RabbitMQ."""
    return make_settings(redis_url, model, broker_url=amqp_url, summary_queue=new_queue(amqp_url))


def test_redis_depth_counts_every_priority_list(settings: Settings, tenant: str) -> None:
    """On Redis the depth is the sum over kombu's priority lists of the queue."""
    check = broker_check(settings, 0.5)
    try:
        assert isinstance(check, RedisBroker) and check.ping() and check.depth() == 0
        publish(settings, tenant, [PRIORITY_AHEAD, PRIORITY_STALE, PRIORITY_AHEAD])
        assert check.depth() == 3
    finally:
        check.close()


def test_redis_oldest_age_is_the_oldest_stamped_job(settings: Settings, tenant: str) -> None:
    """The age of the oldest job the API sent (its send-time header) over every priority list;
    0 with none waiting; a job sent without the stamp (a worker's retry) does not count."""
    check = broker_check(settings, 0.5)
    assert isinstance(check, RedisBroker)
    try:
        assert check.oldest_age() == 0.0
        publish(settings, tenant, [PRIORITY_STALE])
        time.sleep(0.3)
        publish(settings, tenant, [PRIORITY_AHEAD])
        client = connect(settings.broker)
        unstamped = keys.broker_queues(settings.summary_queue)[-1]
        client.rpush(unstamped, json.dumps({"headers": {"task": "prefit.summarize"}}))
        client.close()
        age = check.oldest_age()
        assert age is not None and 0.3 <= age < 5.0
        with TestClient(create_app(settings, enqueue=Recorder())) as c:
            metrics = c.get("/metrics").text
        [line] = [x for x in metrics.splitlines() if x.startswith("prefit_summary_queue_oldest")]
        assert 0.3 <= float(line.split()[1]) < 5.0
    finally:
        check.close()


def test_rabbitmq_depth_is_the_queues_ready_messages(
    redis_url: str, model: str, amqp_url: str, tenant: str
) -> None:
    """On RabbitMQ: 0 before anyone declared the queue (a passive declare creates nothing),
    then the messages waiting, whatever their priority."""
    settings = on_rabbitmq(redis_url, model, amqp_url)
    check = broker_check(settings, 0.5)
    try:
        assert isinstance(check, AmqpBroker) and check.ping() and check.depth() == 0
        publish(settings, tenant, [PRIORITY_AHEAD, PRIORITY_STALE])
        assert check.depth() == 2
    finally:
        check.close()


@pytest.mark.slow
@needs_rabbitmqctl
def test_a_connection_rabbitmq_dropped_is_made_again_without_a_false_alarm(
    redis_url: str, model: str, amqp_url: str
) -> None:
    """The kept connection closed by the broker (a restart): the next check answers anyway."""
    check = broker_check(on_rabbitmq(redis_url, model, amqp_url), 0.5)
    try:
        assert check.ping()
        assert drop_connections(connection_name("api")) >= 1
        assert check.ping() and check.depth() == 0
    finally:
        check.close()


def test_rabbitmq_down_fails_the_check_quickly(redis_url: str, model: str) -> None:
    """Nothing listening where the URL points: the check raises at once, it never hangs."""
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    check = broker_check(make_settings(redis_url, model, broker_url=url), 0.5)
    started = time.monotonic()
    for call in (check.ping, check.depth):
        try:
            call()
        except Exception as exc:
            assert type(exc).__name__ == "OperationalError"
        else:
            raise AssertionError(f"{call.__name__} answered without a broker")
    assert time.monotonic() - started < 2
    check.close()


def test_readiness_and_metrics_read_rabbitmq(
    redis_url: str, model: str, amqp_url: str, tenant: str
) -> None:
    """With the queue on RabbitMQ, /readyz says the broker answers and /metrics has its depth."""
    settings = on_rabbitmq(redis_url, model, amqp_url)
    publish(settings, tenant, [PRIORITY_AHEAD])
    with TestClient(create_app(settings, enqueue=Recorder())) as c:
        ready = c.get("/readyz")
        metrics = c.get("/metrics").text
    assert ready.status_code == 200 and ready.json()["broker"] is True
    assert "prefit_broker_up 1.0" in metrics and "prefit_summary_queue_depth 1.0" in metrics
    assert "prefit_summary_queue_oldest_seconds" not in metrics  # RabbitMQ cannot tell


def test_rabbitmq_down_is_not_ready_yet_the_store_metrics_stay(redis_url: str, model: str) -> None:
    """RabbitMQ unreachable, Redis fine: /readyz is 503 naming the broker; a scrape still has
    the store's metrics, says the broker is down, and has no queue depth it cannot know."""
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    with TestClient(create_app(make_settings(redis_url, model, broker_url=url))) as c:
        ready = c.get("/readyz")
        metrics = c.get("/metrics").text
    assert ready.status_code == 503 and ready.json()["broker"] is False
    assert ready.json()["redis"] is True and "broker" in ready.json()["error"]["message"]
    assert "prefit_store_up 1.0" in metrics and "prefit_broker_up 0.0" in metrics
    assert "prefit_summary_queue_depth" not in metrics
