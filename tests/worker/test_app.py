"""The Celery app: delivery guarantees, one visibility timeout, priorities, threads, no results,
on a Redis or a RabbitMQ broker."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import structlog
from celery.app.utils import find_app

from shared.service.broker import celery_options
from shared.service.jobs import TASK_NAME
from shared.settings import Settings
from worker.app import (
    HEARTBEAT_S,
    celery_config,
    check_consumer_timeout,
    make_app,
    restore_interval,
)


def test_delivery_is_at_least_once_with_late_acks() -> None:
    """Acks are late, a lost worker's task goes back to the queue, one prefetched per slot."""
    conf = make_app(Settings(redis_url="redis://127.0.0.1:1/0")).conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1


def test_no_result_backend_keeps_summaries_out_of_results() -> None:
    """Results are ignored and there is no result backend at all."""
    conf = make_app(Settings()).conf
    assert conf.task_ignore_result is True
    assert not conf.result_backend
    assert "result_backend_transport_options" not in celery_config(Settings())


def test_one_visibility_timeout_from_settings() -> None:
    """The broker's visibility timeout is Settings.visibility_timeout_s, swept in step with it."""
    options = make_app(Settings(visibility_timeout_s=5)).conf.broker_transport_options
    assert options["visibility_timeout"] == 5
    assert options["unacked_restore_interval"] == 1 and options["unacked_restore_throttle"] == 1
    assert restore_interval(3600) == 10 and restore_interval(30) == 6


def test_a_broker_connection_left_half_open_is_found_within_seconds() -> None:
    """Heartbeats every few seconds on RabbitMQ (Celery's default is 120 s) and a PING as
    often on a Redis broker (redis-py's default is 25 s): summaries flow <= 10 s after a
    broker that vanished without closing its connections comes back."""
    amqp = make_app(Settings(broker_url="amqp://guest:guest@127.0.0.1:1//")).conf
    assert amqp.broker_heartbeat == HEARTBEAT_S and 2 * HEARTBEAT_S < 10
    on_redis = make_app(Settings(redis_url="redis://127.0.0.1:1/0")).conf
    assert on_redis.broker_transport_options["health_check_interval"] == HEARTBEAT_S


def test_broker_queue_and_priorities() -> None:
    """Broker and queue come from settings; the Redis transport keeps ten priority steps."""
    settings = Settings(
        redis_url="redis://127.0.0.1:7/3",
        summary_queue="sums-x",
        broker_url=None,
        redis_cluster=False,
    )
    conf = make_app(settings).conf
    assert conf.broker_url == "redis://127.0.0.1:7/3"
    assert conf.task_default_queue == "sums-x"
    assert conf.task_routes == {TASK_NAME: {"queue": "sums-x"}}
    options = conf.broker_transport_options
    assert options["priority_steps"] == list(range(10))
    assert options["queue_order_strategy"] == "priority"
    other = make_app(Settings(broker_url="redis://127.0.0.1:8/0")).conf
    assert other.broker_url == "redis://127.0.0.1:8/0"


def test_threads_pool_sized_by_settings() -> None:
    """The default pool is threads, as many as Settings.worker_concurrency."""
    conf = make_app(Settings(worker_concurrency=256)).conf
    assert conf.worker_pool == "threads" and conf.worker_concurrency == 256


def test_task_is_registered_by_name_with_the_retry_limit() -> None:
    """`prefit.summarize` is bound, late-acked and retried at most max_redeliveries times."""
    app = make_app(Settings(max_redeliveries=7))
    task = app.tasks[TASK_NAME]
    assert task.max_retries == 7 and task.acks_late is True and task.ignore_result is True


def test_command_line_finds_the_app() -> None:
    """`celery -A worker.app` resolves (as the CLI does) to the module's app and its task."""
    from worker.app import app

    found = find_app("worker.app")
    assert found is app and TASK_NAME in found.tasks


def test_on_rabbitmq_the_worker_declares_the_queue_as_the_api_does() -> None:
    """An amqp:// broker: the queue is declared with the shared arguments (priorities, consumer
    timeout), publishes are confirmed, and none of the Redis transport's options is set."""
    settings = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//", summary_queue="sums-a")
    config = celery_config(settings)
    assert config["task_queues"] == celery_options(settings, "api")["task_queues"]
    options = config["broker_transport_options"]
    assert options["confirm_publish"] is True
    assert options["client_properties"]["connection_name"].startswith("prefit-worker ")
    assert config["task_default_queue"] == "sums-a" and "broker_transport" not in config
    assert config["worker_prefetch_multiplier"] == 1 and config["task_acks_late"] is True


def test_on_redis_the_queue_needs_no_declaration() -> None:
    """The Redis broker keeps its priority lists and redelivery sweep, and no queue arguments."""
    config = celery_config(Settings(redis_url="redis://127.0.0.1:7/3"))
    assert "task_queues" not in config
    options = config["broker_transport_options"]
    assert options["priority_steps"] == list(range(10)) and options["unacked_restore_throttle"] == 1


def test_a_worker_on_an_old_rabbitmq_warns_that_the_consumer_timeout_is_ignored() -> None:
    """At start-up the worker reads the server's version: before 3.11.15 the queue's consumer
    timeout is ignored, and it says which broker-wide setting takes its place."""
    amqp = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//", visibility_timeout_s=600)
    for version, warned in (("3.10.8", True), ("3.13.7", False)):
        server = SimpleNamespace(server_properties={"version": version})
        consumer = SimpleNamespace(connection=SimpleNamespace(connection=server))
        with structlog.testing.capture_logs() as logs:
            check_consumer_timeout(consumer, amqp)
            check_consumer_timeout(consumer, Settings())  # a Redis broker: nothing to check
        events = [e for e in logs if e["event"] == "broker.consumer_timeout_ignored"]
        assert len(events) == (1 if warned else 0)
        assert all("consumer_timeout = 600000" in e["note"] for e in events)


QUIETED_CHECK = """
import warnings
from celery.exceptions import CPendingDeprecationWarning
from celery.worker.consumer.consumer import CANCEL_TASKS_BY_DEFAULT
from shared.logs import configure_logging
from shared.settings import Settings
from worker.app import make_app, quiet_celery_warnings

configure_logging(json=True)
make_app(Settings()).log.setup(loglevel="INFO")  # what the command-line worker does
quiet_celery_warnings()
warnings.warn(CPendingDeprecationWarning(CANCEL_TASKS_BY_DEFAULT), stacklevel=1)
warnings.warn("first line\\nsecond line", UserWarning, stacklevel=1)
"""


def test_after_celerys_log_set_up_warnings_are_one_json_line_and_deprecations_none() -> None:
    """Celery's set-up captures warnings into multi-line records and wants its deprecations
    always; once the worker is ready its reconnect deprecation is gone and any other warning
    is one `python.warned` line (in a process of its own: the set-up is process-wide)."""
    run = subprocess.run(
        [sys.executable, "-c", QUIETED_CHECK], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    [line] = run.stderr.strip().splitlines()
    record = json.loads(line)
    assert (record["event"], record["category"], record["text"]) == (
        "python.warned",
        "UserWarning",
        "first line",
    )
