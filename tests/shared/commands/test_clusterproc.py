"""ClusterProcess: a throwaway Redis Cluster that serves every slot and leaves nothing behind."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from shared.commands.clusterproc import BUS_OFFSET, ClusterProcess, _bindable, free_node_port
from shared.commands.redisproc import reachable
from shared.errors import ConfigError
from tests.redisbackend import require_cluster


def test_a_cluster_needs_three_masters() -> None:
    """Fewer than three masters is refused before anything starts."""
    with pytest.raises(ConfigError, match="at least 3 masters"):
        ClusterProcess(2)


def test_a_node_port_comes_with_a_free_bus_port() -> None:
    """The port and its cluster bus port (+10000) are both free when picked."""
    port = free_node_port()
    assert port + BUS_OFFSET < 65_536
    assert _bindable(port) and _bindable(port + BUS_OFFSET)


@pytest.mark.slow
def test_a_started_cluster_serves_every_slot_and_stop_removes_it() -> None:
    """Three masters split the slots; a cluster client from the first node's URL reaches all
    of them; stop() ends every node and removes their directories."""
    require_cluster()
    with ClusterProcess() as cluster:
        nodes, dirs = list(cluster.nodes), [n.dir for n in cluster.nodes]
        plain = redis.Redis.from_url(cluster.url)
        info = plain.cluster("INFO")
        plain.close()
        assert info["cluster_state"] == "ok" and info["cluster_size"] == "3"
        client = RedisCluster.from_url(cluster.url)
        assert len(client.get_primaries()) == 3
        client.close()
    assert cluster.nodes == []
    assert not any(reachable(n.url) for n in nodes)
    assert not any(d is not None and d.exists() for d in dirs)
