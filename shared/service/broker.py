"""What the API's publisher and the workers must agree on about the broker, Redis or RabbitMQ.

The summary queue lives on Redis (kombu's Redis transport; the store's Redis unless
`PREFIT_BROKER_URL` names another) or on RabbitMQ (`PREFIT_BROKER_URL=amqp://...`). Both ends
of the queue take their Celery settings from here, because:

- priorities run in opposite directions: kombu's Redis transport keeps one list per step and
  pops the LOWEST step first, AMQP delivers the HIGHEST priority first (`x-max-priority`).
  Callers speak in ranks, 0 the most urgent (`shared.service.jobs.PRIORITY_STALE`), and `priority`
  turns a rank into the number the broker serves in that order;
- RabbitMQ refuses to declare a queue again with other arguments (PRECONDITION_FAILED), and
  both ends declare it: the API when it publishes, the workers when they consume;
- `PREFIT_VISIBILITY_TIMEOUT_S` is how long a delivery may stay unacknowledged before the
  broker hands it out again: kombu's visibility timeout on Redis, RabbitMQ's consumer timeout
  (the `x-consumer-timeout` queue argument) on AMQP.

Plain data only: this module imports neither Celery nor kombu.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal
from urllib.parse import urlsplit

from shared.errors import ConfigError
from shared.settings import Settings

BrokerKind = Literal["redis", "amqp"]
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})
MAX_PRIORITY = 9  # ranks 0..9: ten Redis lists, or RabbitMQ's x-max-priority 9
# RabbitMQ versions whose classic queues honour `x-consumer-timeout` (added in 3.11.15;
# 4.3 moved consumer timeouts to quorum queues, and 4.3.2 refuses the argument on classic ones)
QUEUE_TIMEOUT_FROM, QUEUE_TIMEOUT_UNTIL = (3, 11, 15), (4, 3, 0)


def broker_kind(url: str) -> BrokerKind:
    """`amqp` for RabbitMQ URLs; anything else is one of kombu's Redis transports."""
    return "amqp" if urlsplit(url).scheme.lower() in AMQP_SCHEMES else "redis"


def priority(rank: int, broker_url: str) -> int:
    """The message priority that serves `rank` (0 first, MAX_PRIORITY last) in rank order."""
    if not 0 <= rank <= MAX_PRIORITY:
        raise ConfigError(f"priority rank {rank} outside 0..{MAX_PRIORITY}")
    return MAX_PRIORITY - rank if broker_kind(broker_url) == "amqp" else rank


def queue_arguments(settings: Settings) -> dict[str, int]:
    """The RabbitMQ arguments of the summary queue: every declaration must pass exactly these."""
    arguments = {"x-max-priority": MAX_PRIORITY}
    if settings.rabbitmq_consumer_timeout_arg:
        arguments["x-consumer-timeout"] = consumer_timeout_ms(settings)
    return arguments


def celery_options(settings: Settings, role: Literal["api", "worker"]) -> dict[str, Any]:
    """The Celery settings both ends of the summary queue share (the API adds its timeouts,
    the workers their redelivery sweep): how the queue is declared and priorities stored."""
    queue = settings.summary_queue
    if broker_kind(settings.broker) == "amqp":
        declared = {"exchange": queue, "routing_key": queue}
        return {
            "task_queues": {queue: {**declared, "queue_arguments": queue_arguments(settings)}},
            "broker_transport_options": {
                # a publish returns once RabbitMQ has taken the message (publisher confirms)
                "confirm_publish": True,
                # what RabbitMQ's connection list shows: which process holds the connection
                "client_properties": {"connection_name": connection_name(role)},
            },
        }
    return {
        "broker_transport_options": {
            "priority_steps": list(range(MAX_PRIORITY + 1)),
            "queue_order_strategy": "priority",
            "visibility_timeout": settings.visibility_timeout_s,
        }
    }


def connection_name(role: str) -> str:
    """`prefit-<role> <host>:<pid>`, the name this process's RabbitMQ connections carry."""
    return f"prefit-{role} {socket.gethostname()}:{os.getpid()}"


def consumer_timeout_note(server_version: str, settings: Settings) -> str | None:
    """Why the queue's consumer timeout is not in effect on this RabbitMQ, or None if it is."""
    try:
        version = tuple(int(part) for part in server_version.split(".")[:3])
    except ValueError:
        return None  # not a release number we can compare: say nothing rather than guess
    wanted = f"consumer_timeout = {consumer_timeout_ms(settings)} (or more) in rabbitmq.conf"
    if version >= QUEUE_TIMEOUT_UNTIL:
        return f"RabbitMQ {server_version} has no consumer timeout on classic queues"
    if version < QUEUE_TIMEOUT_FROM:
        return f"RabbitMQ {server_version} ignores x-consumer-timeout: set {wanted}"
    if not settings.rabbitmq_consumer_timeout_arg:
        return f"x-consumer-timeout is off (PREFIT_RABBITMQ_CONSUMER_TIMEOUT_ARG): set {wanted}"
    return None


def consumer_timeout_ms(settings: Settings) -> int:
    """The consumer timeout the queue asks for: the visibility timeout, in milliseconds."""
    return int(settings.visibility_timeout_s * 1000)
