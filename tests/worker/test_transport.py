"""The guarded Redis transport: a channel closed after its Connection let go still gives back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.worker import consumer as celery_consumer
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from shared.settings import Settings
from worker.app import celery_config
from worker.transport import RECONNECT_S, TRANSPORT, Consumer, Transport, transport_for


@pytest.fixture
def queue(redis_broker_url: str) -> Iterator[str]:
    name = f"guard-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_broker_url)
    client.delete(name, f"_kombu.binding.{name}")
    client.close()


def _deliver_one(conn: Connection, queue: str) -> Any:
    """Publish one message and consume it without acking: the channel now holds it unacked."""
    q = Queue(queue, Exchange(queue), queue)
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=q.exchange, routing_key=queue, declare=[q])
    got: list[Any] = []
    conn.Consumer([q], callbacks=[lambda body, message: got.append(message)]).consume()
    conn.drain_events(timeout=5)
    assert len(got) == 1
    return conn.default_channel


def test_a_detached_channel_still_gives_its_unacked_messages_back(
    redis_broker_url: str, queue: str
) -> None:
    """Closing a channel after `collect()` detached its Connection restores its message."""
    conn = Connection(redis_broker_url, transport=Transport)
    channel = _deliver_one(conn, queue)
    conn.transport.client = None  # what a half-failed `Connection.collect()` leaves behind
    channel.close()  # kombu's own channel raises AttributeError here (next test)
    client = redis.Redis.from_url(redis_broker_url)
    try:
        assert client.llen(queue) == 1  # back in its queue for the next worker
    finally:
        client.close()


def test_kombus_own_channel_still_fails_there(redis_broker_url: str, queue: str) -> None:
    """Why the guard exists: kombu 5.7's channel raises AttributeError in the same spot.

    If this starts failing, kombu fixed it upstream and worker/transport.py can go.
    """
    conn = Connection(redis_broker_url, transport=kombu_redis.Transport)
    channel = _deliver_one(conn, queue)
    conn.transport.client = None
    with pytest.raises(AttributeError, match="hostname"):
        channel.close()
    channel.connection.client = conn  # let the channel give the message back after all
    channel.qos._delivered.restored = False
    channel.qos.restore_unacked_once()


def test_the_guard_is_used_for_plain_redis_brokers_only() -> None:
    """redis:// brokers get the guarded transport; rediss:// and AMQP keep kombu's own."""
    assert transport_for("redis://127.0.0.1:6379/0") == TRANSPORT
    assert transport_for("rediss://cache.example:6380/0") is None
    assert transport_for("amqp://guest:guest@127.0.0.1:5672//") is None
    config = celery_config(Settings(redis_url="redis://127.0.0.1:1/0"))
    assert config["broker_transport"] == TRANSPORT
    assert "broker_transport" not in celery_config(Settings(broker_url="amqp://127.0.0.1//"))


def test_the_worker_reconnects_to_the_broker_forever() -> None:
    """Celery would give up after 100 reconnects (~45 min) and exit; ours never does."""
    assert celery_config(Settings())["broker_connection_max_retries"] is None


def test_the_consumer_tries_a_lost_broker_every_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' consumer reconnects every RECONNECT_S, not on Celery's 2, 4, 6 ... 30 s."""
    config = celery_config(Settings())
    assert config["worker_consumer"] == "worker.transport:Consumer"
    assert config["worker_enable_prefetch_count_reduction"] is False  # celery#9512
    seen: dict[str, Any] = {}

    class Conn:
        def ensure_connection(self, *args: Any, **kwargs: Any) -> str:
            seen.update(kwargs)
            return "connected"

    def celerys(self: Any, conn: Any) -> Any:
        return conn.ensure_connection(None, None, callback=None)  # as Celery calls it

    monkeypatch.setattr(celery_consumer.Consumer, "ensure_connected", celerys)
    consumer = Consumer.__new__(Consumer)
    assert consumer.ensure_connected(Conn()) == "connected"
    assert seen["interval_step"] == seen["interval_max"] == RECONNECT_S == 1.0
