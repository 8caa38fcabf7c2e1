"""The Store facade: ping, StoreUnavailable when Redis is down or silent, recovery on restart."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared.commands.redisproc import RedisProcess, free_port
from shared.errors import NotFound, StoreUnavailable
from shared.settings import Settings
from shared.store import Store
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.redisbackend import needs_redis_server, require_redis_server

H = "v2:" + "0" * 32
CALLS: dict[str, Callable[[Store, str], Any]] = {
    "append": lambda s, t: s.conversations.append(t, "c", numbered_chat(1)),
    "read": lambda s, t: s.conversations.read(t, "c"),
    "put": lambda s, t: s.records.put(t, "c", SummaryRecord(1, H, "x")),
    "best": lambda s, t: s.records.best(t, "c"),
    "ratio": lambda s, t: s.ratios.observe(t, "m", 1.0),
    "usage": lambda s, t: s.usage.add(t, 1, 1, 0.0),
    "dead_letters": lambda s, t: s.dead_letters.list(t),
    "lease": lambda s, t: s.leases.acquire(t, "c", "w", 10),
}


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisProcess]:
    """A Redis of this module's own, so stopping it harms no other test."""
    require_redis_server()
    with RedisProcess() as proc:
        yield proc


@pytest.fixture(scope="module")
def down_url() -> str:
    """The URL of a loopback port nothing listens on."""
    return f"redis://127.0.0.1:{free_port()}/0"


def test_ping(store: Store) -> None:
    """ping() is True on a live Redis."""
    assert store.ping()


STANDALONE = Settings(redis_cluster=False)
CLUSTER = Settings(redis_cluster=True, broker_url="redis://127.0.0.1:1/0")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_store_unavailable_when_redis_is_down(name: str, tenant: str, down_url: str) -> None:
    """Every part raises StoreUnavailable (not a redis error) when nothing listens."""
    store = Store.from_url(down_url, STANDALONE)
    with pytest.raises(StoreUnavailable):
        CALLS[name](store, tenant)
    assert not store.ping()


def test_store_unavailable_on_timeout(tenant: str) -> None:
    """A server that accepts but never answers gives StoreUnavailable after the socket timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        store = Store.from_url(f"redis://127.0.0.1:{port}/0", STANDALONE, socket_timeout=0.2)
        with pytest.raises(StoreUnavailable):
            store.conversations.read(tenant, "c")


def test_a_cluster_store_needs_a_node_that_answers(down_url: str) -> None:
    """The cluster client reads the topology when it is made: StoreUnavailable when no node
    answers, or one accepts and stays silent."""
    with pytest.raises(StoreUnavailable, match="redis cluster unavailable"):
        Store.from_url(down_url, CLUSTER)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with pytest.raises(StoreUnavailable):
            Store.from_url(url, CLUSTER, socket_timeout=0.2, connect_timeout=0.2)


def test_store_recovers_after_restart(own_redis: RedisProcess, tenant: str) -> None:
    """After Redis restarts on its port, the same Store works again (without persistence: empty)."""
    store = Store.from_url(own_redis.url, Settings())
    store.conversations.append(tenant, "c", numbered_chat(2))
    own_redis.restart()
    with pytest.raises(NotFound):
        store.conversations.read(tenant, "c")
    assert store.conversations.append(tenant, "c", numbered_chat(1)) == 1


def test_out_of_memory_is_store_unavailable_and_writes_nothing(
    own_redis: RedisProcess, tenant: str
) -> None:
    """A Redis refusing writes for lack of memory gives StoreUnavailable, and nothing is stored."""
    store = Store.from_url(own_redis.url, Settings())
    store.client.config_set("maxmemory", 1)
    try:
        with pytest.raises(StoreUnavailable):
            store.conversations.append(tenant, "c", numbered_chat(2))
    finally:
        store.client.config_set("maxmemory", 0)
    assert not store.conversations.exists(tenant, "c")


@needs_redis_server
def test_appendonly_survives_kill(tenant: str) -> None:
    """With appendonly, a SIGKILLed Redis restarted on its directory still has every write."""
    with RedisProcess(appendonly=True) as proc:
        store = Store.from_url(proc.url, Settings())
        store.conversations.append(tenant, "c", numbered_chat(3))
        proc.kill()
        with pytest.raises(StoreUnavailable):
            store.conversations.read(tenant, "c")
        proc.restart()
        assert store.conversations.read(tenant, "c") == numbered_chat(3)
