"""The broker as `/readyz` and `/metrics` see it: does it answer, how many summary jobs wait.

Redis: PING, and the LLEN of kombu's priority lists of the queue; the oldest job waiting is the
tail of a list (kombu pushes on the left and pops on the right), and the API stamps each job it
sends with the time it sent it (the `ENQUEUED_MS` header), so its age is known without taking
it. RabbitMQ: a passive `queue_declare` (it creates nothing and answers with the queue's ready
messages; a queue no one has declared yet holds none). Either way every call is bounded by
`timeout` seconds per step, so a broker that is down or hangs costs a readiness check or a
scrape that long at most.

The RabbitMQ connection is kept between calls (a readiness probe every few seconds should not
open a connection each time); a call that fails on a kept connection drops it and tries once
more on a new one, so a connection the broker closed meanwhile is not reported as an outage.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from shared.service.broker import broker_kind, connection_name
from shared.settings import Settings
from shared.store import keys
from shared.store.client import connect

T = TypeVar("T")

# the header, in every summary job the API sends, of its send time (ms since the epoch)
ENQUEUED_MS = "prefit_enqueued_ms"


class BrokerCheck(Protocol):
    """What the API asks of the broker."""

    def ping(self) -> bool: ...

    def depth(self) -> int:
        """Summary jobs waiting (not yet handed to a worker); raises if the broker is down."""
        ...

    def oldest_age(self) -> float | None:
        """Seconds the oldest stamped job has waited (0 with none waiting), None if the broker
        cannot tell without taking it (RabbitMQ); raises if the broker is down."""
        ...

    def close(self) -> None: ...


class RedisBroker:
    """Celery's Redis transport: the queue is one LIST per priority step."""

    def __init__(self, url: str, queue: str, timeout: float) -> None:
        self._client = connect(url, socket_timeout=timeout, connect_timeout=timeout)
        self._queue = queue

    def ping(self) -> bool:
        return bool(self._client.ping())

    def depth(self) -> int:
        pipe = self._client.pipeline(transaction=False)
        for key in keys.broker_queues(self._queue):
            pipe.llen(key)
        return sum(int(n) for n in pipe.execute())

    def oldest_age(self) -> float | None:
        pipe = self._client.pipeline(transaction=False)
        for key in keys.broker_queues(self._queue):
            pipe.lindex(key, -1)
        stamps = [_enqueued_ms(raw) for raw in pipe.execute() if raw is not None]
        known = [ms for ms in stamps if ms is not None]
        return max(0.0, time.time() - min(known) / 1000) if known else 0.0

    def close(self) -> None:
        self._client.close()


def _enqueued_ms(raw: bytes | str) -> float | None:
    """The send time a kombu Redis message carries in its headers (None for a job sent without
    one, e.g. by a worker's retry)."""
    try:
        stamp = json.loads(raw)["headers"][ENQUEUED_MS]
    except (ValueError, KeyError, TypeError):
        return None
    return float(stamp) if isinstance(stamp, int | float) else None


class AmqpBroker:
    """RabbitMQ through kombu, on one kept connection (made on first use)."""

    def __init__(self, url: str, queue: str, timeout: float) -> None:
        self._url, self._queue, self._timeout = url, queue, timeout
        self._conn: Any = None
        self._lock = threading.Lock()

    def ping(self) -> bool:
        self._call(lambda channel: None)
        return True

    def depth(self) -> int:
        def count(channel: Any) -> int:
            from amqp.exceptions import NotFound

            try:
                return int(channel.queue_declare(queue=self._queue, passive=True).message_count)
            except NotFound:  # declared by neither a worker nor a publish yet: nothing waits
                return 0

        return self._call(count)

    def oldest_age(self) -> float | None:
        return None  # a queued message can be read only by taking it: see RabbitMQ's own metrics

    def _call(self, use: Callable[[Any], T]) -> T:
        with self._lock:
            kept = self._conn is not None
            try:
                return self._once(use)
            except Exception:
                self._drop()
                if not kept:
                    raise
            return self._once(use)  # the kept connection had died: once more, on a new one

    def _once(self, use: Callable[[Any], T]) -> T:
        if self._conn is None:
            from kombu.connection import Connection

            options = {
                "read_timeout": self._timeout,
                "write_timeout": self._timeout,
                "client_properties": {"connection_name": connection_name("api")},
            }
            conn = Connection(  # type: ignore[no-untyped-call]
                self._url, connect_timeout=self._timeout, transport_options=options, heartbeat=0
            )
            # max_retries=0: kombu's connect() would sleep 2 s and try again
            conn.ensure_connection(max_retries=0)  # type: ignore[no-untyped-call]
            self._conn = conn
        channel = self._conn.channel()
        try:
            return use(channel)
        finally:
            if channel.is_open:
                channel.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection may fail: it is gone either way
                conn.collect()

    def close(self) -> None:
        with self._lock:
            self._drop()


def broker_check(settings: Settings, timeout: float) -> BrokerCheck:
    """The check for `settings.broker`'s kind; connects to nothing until first used."""
    url, queue = settings.broker, settings.summary_queue
    if broker_kind(url) == "amqp":
        return AmqpBroker(url, queue, timeout)
    return RedisBroker(url, queue, timeout)
