"""A throwaway Redis Cluster on loopback: for the tests and benchmarks of the cluster store.

`ClusterProcess(3)` starts three `redis-server --cluster-enabled yes` children
(shared/commands/redisproc.py), each on a free port and in a temporary directory of its own (a node
keeps its cluster state in `nodes.conf` there), joins them with `redis-cli --cluster create
... --cluster-replicas 0` (the slots split evenly, no replicas) and waits until every node
reports `cluster_state:ok`.
`url` names the first node, as `REDIS_URL` would; a cluster client finds the others from it.

No persistence, as for `RedisProcess`; a node is not restarted (nodes.conf would need its old
port back).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from shared.commands.redisproc import RedisProcess, find_redis_server
from shared.errors import ConfigError, StoreUnavailable

START_TIMEOUT_S = 20.0
BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000
# Node options: a short node timeout, so a test cluster notices a stopped node quickly.
NODE_OPTIONS = (
    "--cluster-enabled", "yes",
    "--cluster-config-file", "nodes.conf",
    "--cluster-node-timeout", "2000",
)  # fmt: skip


def find_redis_cli(server: str | None = None) -> str | None:
    """A redis-cli executable: beside `server` (the redis-server in use), else on PATH."""
    if server is not None:
        beside = Path(server).with_name("redis-cli")
        if beside.is_file():
            return str(beside)
    return shutil.which("redis-cli")


def free_node_port() -> int:
    """A loopback port free right now whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randrange(20_000, 65_535 - BUS_OFFSET)
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise StoreUnavailable("no free pair of loopback ports for a cluster node")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class ClusterProcess:
    """A Redis Cluster of `masters` redis-server children bound to 127.0.0.1."""

    def __init__(self, masters: int = 3, *, executable: str | None = None) -> None:
        if masters < 3:
            raise ConfigError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        self.masters = masters
        self._executable = executable
        self.nodes: list[RedisProcess] = []

    @property
    def url(self) -> str:
        """The first node's URL (any node would do for a cluster client)."""
        if not self.nodes:
            raise StoreUnavailable("the cluster is not started")
        return self.nodes[0].url

    def start(self) -> ClusterProcess:
        """Start the nodes, create the cluster and wait until it serves every slot."""
        if self.nodes:
            return self
        exe = self._executable or find_redis_server()
        cli = find_redis_cli(exe)
        if exe is None or cli is None:
            raise ConfigError(
                "a throwaway Redis Cluster needs redis-server and redis-cli (e.g. "
                "`apt-get install redis-server`)"
            )
        try:
            for _ in range(self.masters):
                self.nodes.append(self._node(exe))
            self._create(cli)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate every node and remove their directories."""
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            node.stop()

    def __enter__(self) -> ClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _node(self, exe: str) -> RedisProcess:
        for _ in range(5):  # another process may take a port first: try another pair
            node = RedisProcess(free_node_port(), executable=exe, options=NODE_OPTIONS)
            try:
                return node.start()
            except StoreUnavailable:
                node.stop()
        raise StoreUnavailable("a cluster node did not start")

    def _create(self, cli: str) -> None:
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        argv = [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0"]
        done = subprocess.run(
            [*argv, "--cluster-yes"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise StoreUnavailable(f"redis-cli --cluster create failed: {tail}")

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(self._ok(n) for n in self.nodes):
            if time.monotonic() > deadline:
                raise StoreUnavailable("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def _ok(self, node: RedisProcess) -> bool:
        client = redis.Redis.from_url(node.url, socket_timeout=1.0)
        try:
            info = client.cluster("INFO")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return (
            info.get("cluster_state") == "ok"
            and int(info.get("cluster_known_nodes", 0)) == self.masters
            and int(info.get("cluster_slots_ok", 0)) == 16384
        )
