"""A throwaway Redis Cluster on loopback: for the tests and benchmarks of the cluster store.

`ClusterProcess(3)` starts three `redis-server --cluster-enabled yes` children
(shared/commands/redisproc.py), each on a free port and in a temporary directory of its own (a node
keeps its cluster state in `nodes.conf` there), joins them with `redis-cli --cluster create
... --cluster-replicas 0` (the slots split evenly, no replicas) and waits until every node
reports `cluster_state:ok`.
`url` names the first node, as `REDIS_URL` would; a cluster client finds the others from it.

`ClusterProcess(3, replicas=1)` gives every master a replica (six nodes), for failover tests
and drills: `primary_for(key)`, `replica_of(node)`, `failover(replica)` (a manual CLUSTER
FAILOVER) and the nodes' own `kill()`/`restart()` (a node keeps its port and directory, so its
nodes.conf lets it rejoin, as a replica of whoever took its slots). `node_timeout_ms` is
`cluster-node-timeout`: how long a silent master has before its replica takes over.
No persistence unless `appendonly` (then AOF, fsynced every second, as in production).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from shared.commands.redisproc import RedisProcess, find_redis_server
from shared.errors import ConfigError, StoreUnavailable

START_TIMEOUT_S = 20.0
BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000
NODE_TIMEOUT_MS = 2000  # short, so a test cluster notices a stopped node quickly


def node_options(
    node_timeout_ms: int = NODE_TIMEOUT_MS, *, appendonly: bool = False
) -> tuple[str, ...]:
    """redis-server arguments of a cluster node."""
    options: tuple[str, ...] = (
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms),
    )  # fmt: skip
    if appendonly:
        options += ("--appendonly", "yes", "--appendfsync", "everysec")
    return options


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
    """A Redis Cluster of `masters` redis-server children bound to 127.0.0.1, each with
    `replicas` replicas."""

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        appendonly: bool = False,
        executable: str | None = None,
    ) -> None:
        if masters < 3:
            raise ConfigError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        if replicas < 0:
            raise ConfigError(f"replicas must be 0 or more, got {replicas}")
        self.masters = masters
        self.replicas = replicas
        self._options = node_options(node_timeout_ms, appendonly=appendonly)
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
            for _ in range(self.masters * (1 + self.replicas)):
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
            node = RedisProcess(free_node_port(), executable=exe, options=self._options)
            try:
                return node.start()
            except StoreUnavailable:
                node.stop()
        raise StoreUnavailable("a cluster node did not start")

    def _create(self, cli: str) -> None:
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        argv = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas)]
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
        self.wait_ok(START_TIMEOUT_S)
        if self.replicas:  # replicas are placed by `--cluster create` once the masters agree
            self.wait_synced(START_TIMEOUT_S)

    def wait_ok(self, timeout: float) -> None:
        """Wait until every running node reports `cluster_state:ok` with every slot served."""
        deadline = time.monotonic() + timeout
        while not all(self._ok(n) for n in self.nodes if n.running):
            if time.monotonic() > deadline:
                raise StoreUnavailable("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def wait_synced(self, timeout: float) -> None:
        """Wait until every master has its replicas attached and in sync."""
        deadline = time.monotonic() + timeout
        while not all(self._synced(n) for n in self.primaries()):
            if time.monotonic() > deadline:
                raise StoreUnavailable("the replicas did not sync with their masters")
            time.sleep(0.05)

    def primaries(self) -> list[RedisProcess]:
        """The running nodes serving slots now."""
        return [n for n in self.nodes if n.running and self._role(n) == "master"]

    def primary_for(self, key: str) -> RedisProcess:
        """The running node serving `key`'s slot now (as a master itself says)."""
        asked = self.primaries()[0]
        slot = int(self._ask(asked, "CLUSTER", "KEYSLOT", key))
        for start, end, master, *_ in self._ask(asked, "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(n for n in self.nodes if n.port == int(master[1]))
        raise StoreUnavailable(f"no running master serves slot {slot}")

    def replica_of(self, master: RedisProcess) -> RedisProcess:
        """A running replica of `master`."""
        node_id = str(self._ask(master, "CLUSTER", "MYID"))
        for node in self.nodes:
            if node is not master and node.running:
                info = self._ask(node, "INFO", "replication")
                if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                    return node
        raise StoreUnavailable(f"master {node_id} has no running replica")

    def failover(self, replica: RedisProcess, timeout: float = START_TIMEOUT_S) -> None:
        """A manual failover (`CLUSTER FAILOVER` on `replica`): it becomes the master of its
        master's slots, without losing a write; returns once it serves them."""
        self._ask(replica, "CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while self._role(replica) != "master":
            if time.monotonic() > deadline:
                raise StoreUnavailable("the manual failover did not complete")
            time.sleep(0.02)
        self.wait_ok(timeout)

    def _synced(self, master: RedisProcess) -> bool:
        info = self._ask(master, "INFO", "replication")
        links = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return len(links) >= self.replicas and all(v.get("state") == "online" for v in links)

    def _role(self, node: RedisProcess) -> str:
        try:
            return str(self._ask(node, "INFO", "replication").get("role"))
        except redis.RedisError:
            return "unknown"

    @staticmethod
    def _ask(node: RedisProcess, *command: str) -> Any:
        client = redis.Redis.from_url(node.url, socket_timeout=1.0, decode_responses=True)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

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
            and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(info.get("cluster_slots_ok", 0)) == 16384
        )
