"""What both ends of the summary queue agree on: priorities, the queue's declaration, timeouts."""

from __future__ import annotations

import os

import pytest

from shared.errors import ConfigError
from shared.service.broker import (
    MAX_PRIORITY,
    broker_kind,
    celery_options,
    connection_name,
    consumer_timeout_note,
    priority,
    queue_arguments,
)
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE
from shared.settings import Settings

REDIS, AMQP = "redis://127.0.0.1:6379/0", "amqp://guest:guest@127.0.0.1:5672//"


def served_first(url: str, ranks: list[int]) -> int:
    """The rank whose message the broker at `url` hands out first."""
    order = sorted(ranks, key=lambda r: priority(r, url), reverse=broker_kind(url) == "amqp")
    return order[0]


def test_the_kind_comes_from_the_url_scheme() -> None:
    """amqp, amqps and pyamqp URLs are RabbitMQ; the rest are kombu's Redis transports."""
    assert [broker_kind(u) for u in (AMQP, "amqps://h//", "pyamqp://h//")] == ["amqp"] * 3
    assert [broker_kind(u) for u in (REDIS, "rediss://h:6380/0", "sentinel://h")] == ["redis"] * 3


def test_a_stale_job_is_served_first_on_either_broker() -> None:
    """Redis pops the lowest priority first, AMQP delivers the highest: ranks map to each."""
    for url in (REDIS, AMQP):
        assert served_first(url, [PRIORITY_AHEAD, PRIORITY_STALE, MAX_PRIORITY]) == PRIORITY_STALE
    assert (priority(PRIORITY_STALE, REDIS), priority(PRIORITY_AHEAD, REDIS)) == (0, 6)
    assert (priority(PRIORITY_STALE, AMQP), priority(PRIORITY_AHEAD, AMQP)) == (9, 3)


def test_a_rank_outside_the_queues_priorities_is_refused() -> None:
    """RabbitMQ would cap a priority over x-max-priority silently; a bad rank raises instead."""
    for bad in (-1, MAX_PRIORITY + 1):
        with pytest.raises(ConfigError, match=r"outside 0\.\.9"):
            priority(bad, AMQP)


def test_rabbitmq_declares_priorities_and_the_visibility_timeout_as_consumer_timeout() -> None:
    """x-max-priority 9, and x-consumer-timeout the visibility timeout in ms unless turned off."""
    settings = Settings(broker_url=AMQP, visibility_timeout_s=7200)
    assert queue_arguments(settings) == {"x-max-priority": 9, "x-consumer-timeout": 7_200_000}
    off = Settings(broker_url=AMQP, rabbitmq_consumer_timeout_arg=False)
    assert queue_arguments(off) == {"x-max-priority": 9}


def test_celery_options_declare_the_queue_on_rabbitmq_and_list_steps_on_redis() -> None:
    """AMQP: the queue (exchange and routing key of its name) with its arguments, confirmed
    publishes; Redis: ten priority lists and the visibility timeout, and no queue arguments."""
    amqp = celery_options(Settings(broker_url=AMQP, summary_queue="sums"), "api")
    assert amqp == {
        "task_queues": {
            "sums": {
                "exchange": "sums",
                "routing_key": "sums",
                "queue_arguments": {"x-max-priority": 9, "x-consumer-timeout": 3_600_000},
            }
        },
        "broker_transport_options": {
            "confirm_publish": True,
            "client_properties": {"connection_name": connection_name("api")},  # see below
        },
    }
    assert connection_name("api").startswith("prefit-api ")  # its host and process id
    assert connection_name("api").endswith(f":{os.getpid()}")
    redis = celery_options(Settings(redis_url=REDIS, visibility_timeout_s=60), "worker")
    assert redis == {
        "broker_transport_options": {
            "priority_steps": list(range(10)),
            "queue_order_strategy": "priority",
            "visibility_timeout": 60,
        }
    }


@pytest.mark.parametrize(
    ("version", "arg", "says"),
    [
        ("3.10.8", True, "ignores x-consumer-timeout: set consumer_timeout = 3600000"),
        ("3.11.14", True, "ignores x-consumer-timeout"),
        ("3.11.15", True, None),
        ("3.13.7", True, None),
        ("3.13.7", False, "is off (PREFIT_RABBITMQ_CONSUMER_TIMEOUT_ARG)"),
        ("4.2.1", True, None),
        ("4.3.2", False, "no consumer timeout on classic queues"),
        ("unknown", True, None),
    ],
)
def test_the_worker_can_say_when_the_consumer_timeout_is_not_in_effect(
    version: str, arg: bool, says: str | None
) -> None:
    """Servers before 3.11.15 ignore the queue argument (the broker-wide setting rules); 4.3
    has none on classic queues; a version that is no release number gets no guess."""
    note = consumer_timeout_note(version, Settings(rabbitmq_consumer_timeout_arg=arg))
    assert note is None if says is None else note is not None and says in note
