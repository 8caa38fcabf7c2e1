"""Store calls on a cluster retry what is safe to run again, within the deadline: reads on any
fault, writes only on refusals or a connection never made; a standalone client never retries."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import MovedError

from shared.errors import StoreUnavailable
from shared.store.client import (
    Client,
    closed_transport,
    connect,
    guarded,
    guarded_once,
    guarded_read,
    never_sent,
    retry_within,
    retryable,
)

REFUSED_CONNECT = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
DROPPED = redis.ConnectionError("Connection closed by server.")


class Flaky:
    """Calls that fail with `errors` in turn, then answer "ok"; `_r` is the client `guarded`
    looks at."""

    def __init__(self, client: Client, *errors: Exception) -> None:
        self._r = client
        self.errors = list(errors)
        self.calls = 0

    def _next(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    @guarded
    def write(self) -> str:
        return self._next()

    @guarded_read
    def read(self) -> str:
        return self._next()

    @guarded_once
    def write_across_slots(self) -> str:
        return self._next()


@pytest.fixture(scope="module")
def cluster_client(cluster_url: str) -> Iterator[Client]:
    client = connect(cluster_url, cluster=True)
    yield client
    client.close()


def test_what_is_safe_to_run_again() -> None:
    """Refusals and connections never made are safe for writes; anything is for reads."""
    moved = MovedError("3999 127.0.0.1:6381")
    assert retryable(moved, reads=False) and retryable(REFUSED_CONNECT, reads=False)
    assert never_sent(redis.TimeoutError("Timeout connecting to server"))
    assert not retryable(DROPPED, reads=False)
    assert not retryable(redis.TimeoutError("Timeout reading from socket"), reads=False)
    assert retryable(DROPPED, reads=True)


def test_a_write_is_retried_after_a_redirection_but_not_after_a_dropped_reply(
    cluster_client: Client,
) -> None:
    """MOVED twice, then the answer; a connection dropped mid-write is reported at once."""
    moved = Flaky(cluster_client, MovedError("1 127.0.0.1:1"), MovedError("1 127.0.0.1:1"))
    assert moved.write() == "ok" and moved.calls == 3
    dropped = Flaky(cluster_client, DROPPED)
    with pytest.raises(StoreUnavailable):
        dropped.write()
    assert dropped.calls == 1
    read = Flaky(cluster_client, DROPPED)
    assert read.read() == "ok" and read.calls == 2


def test_a_script_the_new_primary_does_not_know_is_run_again(cluster_client: Client) -> None:
    """NOSCRIPT (a primary promoted after a failover has an empty script cache) is a refusal:
    the write is run again, and once the retries run out it is a StoreUnavailable, not a bug."""
    noscript = redis.exceptions.NoScriptError("No matching script. Please use EVAL.")
    assert retryable(noscript, reads=False)
    flaky = Flaky(cluster_client, noscript)
    assert flaky.write() == "ok" and flaky.calls == 2
    with pytest.raises(StoreUnavailable):
        Flaky(cluster_client, noscript).write_across_slots()


def test_a_closed_socket_is_a_lost_connection_and_other_runtime_errors_are_bugs() -> None:
    """The event loop's RuntimeError for a write on a closed transport (a killed node) is a
    connection fault; any other RuntimeError is not."""
    closed = RuntimeError(
        "unable to perform operation on <TCPTransport closed=True reading=False>; "
        "the handler is closed"
    )
    assert closed_transport(closed)
    assert not closed_transport(RuntimeError("Event loop is closed"))
    assert not closed_transport(ValueError("the handler is closed"))


def test_a_write_across_slots_is_never_retried(cluster_client: Client) -> None:
    """A pipeline spanning nodes may have landed on one of them: even a redirection is reported
    at once, as StoreUnavailable, rather than applying that part twice."""
    across = Flaky(cluster_client, MovedError("1 127.0.0.1:1"))
    with pytest.raises(StoreUnavailable):
        across.write_across_slots()
    assert across.calls == 1


def test_retries_stop_at_the_deadline(cluster_client: Client) -> None:
    """With no time left (the request's deadline), a refusal is reported without a retry."""
    flaky = Flaky(cluster_client, MovedError("1 127.0.0.1:1"))

    def spent() -> str:
        retry_within(lambda: 0.0)
        return flaky.read()

    with pytest.raises(StoreUnavailable):
        contextvars.copy_context().run(spent)
    assert flaky.calls == 1


def test_a_standalone_client_never_retries(redis_url: str) -> None:
    """On a standalone Redis the first fault is the answer (there is no topology to refresh)."""
    client = redis.Redis.from_url(redis_url)
    try:
        flaky = Flaky(client, REFUSED_CONNECT)
        with pytest.raises(StoreUnavailable):
            flaky.read()
        assert flaky.calls == 1
    finally:
        client.close()
