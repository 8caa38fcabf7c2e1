"""kombu's Redis transport with one guard, so a worker outlives a Redis restart.

What it guards against (kombu 5.7.0, celery 5.7.0, redis-py 8.1.0): when Redis dies under load,
Celery's consumer first `collect()`s the broken connection, then `close()`s it.
`collect()` can stop halfway: closing the default channel reads its pending BRPOP reply, which
raises a connection error, and closing the transport's channel list stops at the first error.
The default channel, which holds the unacknowledged deliveries, is then closed only by the
later `close()`, after `collect()` has detached the transport from its Connection
(`transport.client = None`). Closing a channel gives its unacked messages back, through a Redis
client built from the Connection's parameters; with the Connection gone kombu raises
`AttributeError: 'NoneType' object has no attribute 'hostname'` (in `Channel._connparams`),
which Celery does not expect there: the worker stops ("Unrecoverable error"). Under load about
every other Redis restart did it (tests/worker/test_broker_restart.py repeats it).

The guard: a channel remembers the connection parameters it last built and uses them once its
Connection is gone. Giving the messages back then works (Redis is back) or fails with a
connection error, which Celery ignores while closing; either way the messages stay in the
transport's unacked set, where kombu's visibility timeout and our in-flight reaper find them.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit

import redis
from celery.worker import consumer as celery_consumer
from kombu.transport import redis as kombu_redis

# `rediss://` keeps kombu's own transport: its alias also sets kombu's SSL defaults.
GUARDED_SCHEMES = ("redis",)
TRANSPORT = "worker.transport:Transport"


class Channel(kombu_redis.Channel):
    """A Redis channel that can still reach its broker after its Connection let go of it."""

    _remembered: dict[bool, dict[str, Any]] | None = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is not None and transport.client is not None:
            params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
            self._remembered = {**(self._remembered or {}), asynchronous: params}
            return dict(params)
        saved = (self._remembered or {}).get(asynchronous)
        if saved is None:  # never connected: nothing of ours can be waiting in Redis
            raise redis.ConnectionError("broker connection closed before the channel connected")
        return dict(saved)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with the guarded channel."""

    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """The transport to give Celery for `broker_url`: ours for plain Redis, else kombu's."""
    return TRANSPORT if urlsplit(broker_url).scheme in GUARDED_SCHEMES else None


# Seconds between the consumer's attempts to reach the broker again: Celery's consumer waits
# 2, 4, 6 ... up to 30 s between attempts (kombu's defaults), so after a 10 s broker outage a
# worker came back up to 10 s after the broker did. A try every RECONNECT_S costs a refused
# connection per second per worker while the broker is down.
RECONNECT_S = 1.0


class Consumer(celery_consumer.Consumer):  # type: ignore[misc]
    """Celery's consumer, reconnecting to the broker every RECONNECT_S instead of backing off."""

    def ensure_connected(self, conn: Any) -> Any:
        ensure = conn.ensure_connection
        conn.ensure_connection = functools.partial(
            ensure, interval_start=0, interval_step=RECONNECT_S, interval_max=RECONNECT_S
        )
        return super().ensure_connected(conn)
