"""The store on a real Redis Cluster, whatever the session's backend: cluster mode checked at
start-up, keys placed by their hash tags, scripts loaded again on a node that lost them, and
records shared across nodes through the tenant's directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot

from shared.errors import ConfigError
from shared.hashing import prefix_hashes
from shared.settings import Settings
from shared.store import Store, keys
from shared.store.increments import AsyncIncrements, Increment, Increments
from shared.store.writes import Append
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.shared.store.helpers import tenant_keys

pytestmark = pytest.mark.anyio

CLUSTER = Settings(redis_cluster=True, broker_url="redis://127.0.0.1:1/0", retention_s=3600)
STANDALONE = Settings(redis_cluster=False, retention_s=3600)


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[Store]:
    s = Store.from_url(cluster_url, CLUSTER)
    try:
        yield s
    finally:
        s.close()


def nodes(store: Store) -> list[redis.Redis]:
    """A plain client on each primary of the cluster (closed by the caller)."""
    primaries = store.client.get_primaries()  # type: ignore[union-attr]
    return [redis.Redis(host=n.host, port=n.port) for n in primaries]


def on_other_nodes(store: Store, tenant: str, n: int) -> list[str]:
    """`n` conversation ids whose slots are served by `n` different nodes."""
    found: dict[str, str] = {}
    for i in range(200):
        conv = f"c{i}"
        node = store.client.get_node_from_key(keys.conv_meta(tenant, conv))  # type: ignore[union-attr]
        found.setdefault(node.name, conv)
        if len(found) == n:
            return list(found.values())
    raise AssertionError("the cluster has fewer nodes than asked")


def test_a_standalone_client_on_a_cluster_node_is_a_start_up_error(cluster_url: str) -> None:
    """Without PREFIT_REDIS_CLUSTER, a cluster node in REDIS_URL is refused at start-up,
    naming both settings."""
    store = Store.from_url(cluster_url, STANDALONE)
    try:
        with pytest.raises(ConfigError, match=r"REDIS_URL .* PREFIT_REDIS_CLUSTER is not set"):
            store.check_mode(cluster_url)
    finally:
        store.close()


def test_a_cluster_client_on_a_standalone_redis_is_a_start_up_error(standalone_url: str) -> None:
    """PREFIT_REDIS_CLUSTER=true with a standalone Redis in REDIS_URL is refused at once,
    naming both settings; the same Redis without the setting passes the check."""
    with pytest.raises(ConfigError, match=r"PREFIT_REDIS_CLUSTER=true but REDIS_URL .* not a"):
        Store.from_url(standalone_url, CLUSTER)
    store = Store.from_url(standalone_url, STANDALONE)
    store.check_mode(standalone_url)
    store.close()


def test_a_cluster_url_must_name_database_0(cluster_url: str) -> None:
    """A cluster has database 0 only: another in REDIS_URL is a configuration error."""
    with pytest.raises(ConfigError, match="database 0"):
        Store.from_url(cluster_url.rsplit("/", 1)[0] + "/2", CLUSTER)


def test_a_conversations_keys_sit_on_one_node_and_a_tenants_conversations_spread(
    cluster: Store, tenant: str
) -> None:
    """Every key of a conversation, its record included, is on the node of its slot; three
    conversations of one tenant land on three nodes, its directory on the tenant's."""
    convs = on_other_nodes(cluster, tenant, 3)
    for conv in convs:
        msgs = numbered_chat(4, conv)
        cluster.conversations.append(tenant, conv, msgs)
        cluster.records.put(tenant, conv, SummaryRecord(2, prefix_hashes(msgs)[2], "s"))
    placed: dict[int, set[str]] = {}
    for c in nodes(cluster):
        port = c.connection_pool.connection_kwargs["port"]
        placed[port] = {k.decode() for k in c.scan_iter(match=keys.tenant_pattern(tenant))}
        c.close()
    for conv in convs:
        holders = [p for p, found in placed.items() if any(f"/{conv}}}" in k for k in found)]
        assert len(holders) == 1, conv
    assert sum(1 for found in placed.values() if any("/" in k for k in found)) == 3
    assert tenant_keys(cluster.client, tenant) == set().union(*placed.values())


async def test_scripts_run_again_on_nodes_that_lost_them(cluster: Store, tenant: str) -> None:
    """After every node's script cache is flushed (a restart, a failover), each operation
    loads its script again on the node that lacks it: writes, reads, the asyncio read."""
    convs = on_other_nodes(cluster, tenant, 3)
    msgs = numbered_chat(6)
    h = prefix_hashes(msgs)
    for conv in convs:  # every script cached on every node
        cluster.conversations.append(tenant, conv, msgs[:4])
    for c in nodes(cluster):
        c.script_flush()
        c.close()
    for conv in convs:
        done = cluster.conversations.writes.append(
            tenant, conv, Append(msgs[4:], counts=[1, 1], counter="x", upto_max=6)
        )
        assert done.length == 6
        assert cluster.records.put(tenant, conv, SummaryRecord(4, h[4], "to 4"))
        best = cluster.records.best(tenant, conv)
        assert best is not None and best.upto == 4
        since = Increments(cluster.client).since(tenant, conv, start=4, prefix_hash=h[4])
        assert since.matches and since.hashes == h[5:]
        assert await _since_async(cluster, tenant, conv, h) == since
    for c in nodes(cluster):
        c.script_flush()
        c.close()
    assert (await _since_async(cluster, tenant, convs[0], h)).best == best


async def _since_async(store: Store, tenant: str, conv: str, h: list[str]) -> Increment:
    primaries = store.client.get_primaries()  # type: ignore[union-attr]
    client = AsyncRedisCluster(host=primaries[0].host, port=primaries[0].port)
    reader = AsyncIncrements(client)
    try:
        return await reader.since(tenant, conv, start=4, prefix_hash=h[4])
    finally:
        await reader.aclose()


def test_a_fork_on_another_node_reuses_the_record_and_deletes_clean_up(
    cluster: Store, tenant: str
) -> None:
    """Two conversations on two nodes: the second finds the first's record in the tenant's
    directory (a third slot) and copies it; once both are deleted nothing of them is left."""
    first, fork = on_other_nodes(cluster, tenant, 2)
    msgs = numbered_chat(8)
    h = prefix_hashes(msgs)
    slots = {key_slot(k.encode()) for k in (keys.conv_meta(tenant, first),
             keys.conv_meta(tenant, fork), keys.directory(tenant, h[6]))}  # fmt: skip
    assert len(slots) == 3
    for conv in (first, fork):
        cluster.conversations.append(tenant, conv, msgs)
    cluster.claims.commit(tenant, first, SummaryRecord(6, h[6], "to 6"), (10, 5, 0.01))
    found = cluster.records.get(tenant, h[6])
    assert found is not None and found.text == "to 6"
    cluster.records.put(tenant, fork, found)
    assert cluster.records.directory.refs(tenant, h[6]) == {first, fork}
    cluster.conversations.delete(tenant, first)
    best = cluster.records.best(tenant, fork)
    assert best == found
    cluster.conversations.delete(tenant, fork)
    assert cluster.records.get(tenant, h[6]) is None
    assert tenant_keys(cluster.client, tenant) == {keys.usage(tenant)}  # the spend stays
