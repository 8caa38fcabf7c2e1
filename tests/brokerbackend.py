"""Which broker the worker tests run on: the suite's Redis (the default) or RabbitMQ.

`PREFIT_TEST_BROKER` chooses (a switch of the test suite, not a setting of prefit):
- unset or `redis`: Celery's Redis transport on the suite's Redis (`tests.redisbackend`);
- `amqp`: RabbitMQ at `amqp://guest:guest@127.0.0.1:5672//` (the one this machine kind and CI
  run), or `amqp://...` to name another. Tests that need a broker skip, saying why, when it
  does not answer (a laptop without RabbitMQ).

Tests that are about RabbitMQ itself ask for the `amqp_url` fixture instead: they run whenever
RabbitMQ answers, whatever the switch. Every test queue on RabbitMQ has a name of its own
(`summaries-test-<hex>`, fine in any vhost) and is deleted, with its exchange, after the test
(`forget_queues`); the Redis broker's lists live in the suite's throwaway Redis.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from functools import cache
from typing import Any

import pytest

from shared.service.broker import BrokerKind, broker_kind

SWITCH = "PREFIT_TEST_BROKER"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672//"

_queues: list[tuple[str, str]] = []  # (broker URL, queue) declared by tests on RabbitMQ


@cache
def chosen() -> tuple[BrokerKind, str | None]:
    """The switch: the broker kind and, for `amqp`, the RabbitMQ URL."""
    switch = os.environ.get(SWITCH, "").strip()
    if switch in ("", "redis"):
        return "redis", None
    if switch == "amqp":
        return "amqp", LOCAL_AMQP
    if broker_kind(switch) == "amqp":
        return "amqp", switch
    raise pytest.UsageError(f"{SWITCH} must be 'redis', 'amqp' or an amqp:// URL, not {switch!r}")


@cache
def answers(url: str) -> str | None:
    """None if RabbitMQ at `url` accepts a connection, else why not (checked once)."""
    from kombu.connection import Connection

    conn = Connection(url, connect_timeout=2.0, heartbeat=0)
    try:
        conn.ensure_connection(max_retries=0)
    except Exception as exc:
        return f"no RabbitMQ answers at {redact(url)} ({type(exc).__name__}: {exc})"
    finally:
        conn.release()
    return None


def redact(url: str) -> str:
    return url.split("@", 1)[-1] if "@" in url else url


def describe() -> str:
    """One line for the pytest header."""
    kind, url = chosen()
    if url is None:
        return f"broker: the suite's Redis ({SWITCH} unset or redis)"
    why = answers(url)
    return f"broker: RabbitMQ at {redact(url)} ({SWITCH}={kind})" + (
        f"; worker tests skip: {why}" if why else ""
    )


def broker_for_tests() -> str | None:
    """The broker URL the switch gives worker tests (None: the store's Redis); skips the
    calling test when it is RabbitMQ and none answers."""
    _, url = chosen()
    if url is not None:
        require(url)
    return url


def require(url: str) -> str:
    """`url` if RabbitMQ answers there, else skip the calling test or fixture."""
    why = answers(url)
    if why is not None:
        pytest.skip(why)
    return url


def unreachable_broker() -> str:
    """A broker URL of the switch's kind on a port where nothing listens."""
    from shared.commands.redisproc import free_port

    port = free_port()
    if chosen()[0] == "amqp":
        return f"amqp://guest:guest@127.0.0.1:{port}//"
    return f"redis://127.0.0.1:{port}/0"


def new_queue(broker_url: str | None) -> str:
    """A queue name no other test uses; on RabbitMQ it is deleted after the test."""
    name = f"summaries-test-{uuid.uuid4().hex[:10]}"
    if broker_url is not None and broker_kind(broker_url) == "amqp":
        _queues.append((broker_url, name))
    return name


def forget_queues() -> None:
    """Delete the RabbitMQ queues (and their exchanges) tests declared; missing ones are fine."""
    from kombu.connection import Connection
    from kombu.exceptions import OperationalError

    pending = list(_queues)
    _queues.clear()
    for url in {u for u, _ in pending}:
        with Connection(url, connect_timeout=2.0, heartbeat=0) as conn:
            try:
                conn.ensure_connection(max_retries=0)
            except OperationalError:
                continue  # a broker that does not answer (on purpose) holds no queue of ours
            for name in (n for u, n in pending if u == url):
                _delete(conn, name)


needs_rabbitmqctl = pytest.mark.skipif(
    shutil.which("rabbitmqctl") is None,
    reason="rabbitmqctl is not installed: this test has RabbitMQ close a connection",
)


def drop_connections(named: str) -> int:
    """Have RabbitMQ close the connections called `named` (as a broker restart would close
    them); how many it closed. `shared.service.broker.connection_name` names a process's."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    pids = [line.split("\t", 1)[0] for line in listed.splitlines() if named in line]
    for pid in pids:
        subprocess.run(
            ["rabbitmqctl", "close_connection", pid, "test"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
    return len(pids)


def _delete(conn: Any, name: str) -> None:
    channel = conn.channel()
    try:
        channel.queue_delete(name)
        channel.exchange_delete(name)
    finally:
        if channel.is_open:
            channel.close()


def main() -> int:
    """`python -m tests.brokerbackend`: exit 1, saying why, unless RabbitMQ answers (CI runs
    this first, so a RabbitMQ missing there fails the run instead of skipping its tests)."""
    _, url = chosen()
    why = answers(url or LOCAL_AMQP)
    print(why or f"RabbitMQ answers at {redact(url or LOCAL_AMQP)}")
    return 1 if why else 0


if __name__ == "__main__":
    raise SystemExit(main())
