"""Acknowledged means replicated: a write answers only once the store's replicas have it.

Redis replicates asynchronously, so a primary that acknowledged a write and then died before
its replica had it loses the write in the failover, though its client was told 200. Where the
store has replicas, every write prefit acknowledges (an append, a PUT, a summary record, a
job's claim of its conversation) is followed on the same connection, in the same round trip,
by `WAIT n timeout`: the primary answers once `n` replicas have acknowledged everything the
connection wrote, or at the timeout with how many did. Fewer than `n` raises `NotReplicated`
(a `StoreUnavailable`: 503, "may have landed"), so a client resending its append with
`expected_length` finds it landed or not, exactly as after a lost reply.

How many replicas (`PREFIT_REDIS_MIN_REPLICAS_ACK`):

- unset: 1 on a primary with a healthy replica (online in `INFO replication`, its last
  acknowledgment at most `HEALTHY_LAG_S` old), else none: no WAIT at all, so a store
  without replicas pays nothing. Each primary is looked at once per `CACHE_S` (per node of a
  cluster), and again at once after a WAIT came up short, so a replica that died or froze is
  no longer waited for within seconds (writes in between answer 503);
- a number `n`: always `n` (0: never wait). A write to a primary with fewer live replicas is
  then never acknowledged: the strict setting.

The timeout is what is left of the request's deadline (`retry_within`, less a margin;
`UNBOUNDED_WAIT_S` in a worker), at most a little under the socket timeout, never 0 (which
would block forever). The cost is one primary-to-replica round trip per write, spent inside the
write's own round trip. A cluster's WAIT goes to the node of the written key, in the same
pipeline as the write (redis-py sends one node's commands on one connection, in order).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script

from shared.errors import NotReplicated
from shared.logs import get_logger
from shared.store.client import RETRY_MARGIN_S, SOCKET_TIMEOUT_S, Client, request_time_left

log = get_logger(__name__)

CACHE_S = 5.0
HEALTHY_LAG_S = 2  # replicas acknowledge their offset every second
MIN_TIMEOUT_MS = 10
UNBOUNDED_WAIT_S = 1.0  # outside a request (a worker's claim and record): how long WAIT waits
_STANDALONE = "standalone"


@dataclass(frozen=True)
class Acks:
    """A WAIT queued after a write: how many replicas must have it, on which node, how long."""

    needed: int
    node: str
    timeout_ms: int


class Replication:
    """WAITs for the replicas of the node a write went to (see the module)."""

    def __init__(
        self,
        client: Client,
        *,
        min_acks: int | None,
        socket_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._r = client
        self._min_acks = min_acks
        self._cap_s = max(0.05, socket_timeout_s - 0.2)
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # node -> (looked at, healthy replicas)
        self._lock = threading.Lock()

    def wait_in(self, pipe: Any, key: str) -> Acks | None:
        """Queue a WAIT for the write to `key` just queued in `pipe` (None: none needed)."""
        node = self._node(key)
        needed = self._needed(node)
        if needed == 0:
            return None
        left = request_time_left()
        wait_s = left - RETRY_MARGIN_S if left is not None else UNBOUNDED_WAIT_S
        timeout_s = min(self._cap_s, wait_s)
        acks = Acks(needed, _name(node), max(MIN_TIMEOUT_MS, int(timeout_s * 1000)))
        where = {"target_nodes": node} if isinstance(node, ClusterNode) else {}
        pipe.execute_command("WAIT", acks.needed, acks.timeout_ms, **where)
        return acks

    def execute(self, pipe: Any, acks: Acks | None) -> list[Any]:
        """`pipe`'s replies, its first error raised as `execute` would; but a WAIT refused (the
        node it went to was demoted by a failover while the write was redirected to the new
        primary: "WAIT cannot be used with replica instances") counts as no replica's
        acknowledgement, so `check` answers `NotReplicated` ("may have landed")."""
        replies: list[Any] = pipe.execute(raise_on_error=False)
        waited = replies[-1] if acks is not None else None
        for reply in replies:
            if isinstance(reply, Exception) and reply is not waited:
                raise reply
        if isinstance(waited, redis.ResponseError):
            log.warning("store.wait_refused", node=acks.node if acks else None)
            replies[-1] = 0
        elif isinstance(waited, Exception):
            raise waited
        return replies

    def check(self, acks: Acks | None, acked: Any) -> None:
        """`NotReplicated` if fewer replicas than `acks` asked for answered its WAIT."""
        if acks is None or int(acked) >= acks.needed:
            return
        with self._lock:
            self._seen.pop(acks.node, None)  # look at the node's replicas again
        log.warning(
            "store.write_unreplicated", node=acks.node, needed=acks.needed, acked=int(acked)
        )
        raise NotReplicated(
            f"the write reached the primary but {int(acked)} of {acks.needed} replicas "
            f"acknowledged it within {acks.timeout_ms} ms: it may have landed; retry "
            "(appends with expected_length)"
        )

    @classmethod
    def never(cls, client: Client) -> Replication:
        """One that never waits (`min_acks` 0): for parts built without the settings."""
        return cls(client, min_acks=0, socket_timeout_s=SOCKET_TIMEOUT_S)

    def run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """`script(keys, args)`, acknowledged only once replicated: the script and its WAIT in
        one round trip (a plain call where no WAIT is needed)."""
        if self._needed(self._node(keys[0])) == 0:
            return script(keys=keys, args=args)
        for attempt in (1, 2):
            pipe = self._r.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            acks = self.wait_in(pipe, keys[0])
            try:
                replies = self.execute(pipe, acks)
            except redis.exceptions.NoScriptError:  # it never ran: load it, run it again
                if attempt == 2:
                    raise
                self._r.script_load(script.script)
                continue
            self.check(acks, replies[-1])
            return replies[0]
        raise AssertionError("unreachable")

    def _node(self, key: str) -> ClusterNode | None:
        if isinstance(self._r, RedisCluster):
            found: ClusterNode = self._r.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return found
        return None

    def _needed(self, node: ClusterNode | None) -> int:
        if self._min_acks is not None:
            return self._min_acks
        name, now = _name(node), self._clock()
        with self._lock:
            seen = self._seen.get(name)
        if seen is None or now - seen[0] > CACHE_S:
            seen = (now, self._healthy_replicas(node))
            with self._lock:
                self._seen[name] = seen
        return min(1, seen[1])

    def _healthy_replicas(self, node: ClusterNode | None) -> int:
        try:
            if isinstance(self._r, RedisCluster):
                info = self._r.info("replication", target_nodes=node)
            else:
                info = self._r.info("replication")
        except (redis.RedisError, OSError) as exc:  # the write itself will say if Redis is down
            log.info("store.replicas_unread", error=type(exc).__name__)
            return 0
        return healthy_replicas(info)


def healthy_replicas(info: dict[str, Any]) -> int:
    """The replicas an `INFO replication` reply lists as online and acknowledging."""
    count = 0
    for name, value in info.items():
        if not (name.startswith("slave") and name[5:].isdigit() and isinstance(value, dict)):
            continue
        if value.get("state") == "online" and int(value.get("lag", HEALTHY_LAG_S + 1)) <= (
            HEALTHY_LAG_S
        ):
            count += 1
    return count


def _name(node: ClusterNode | None) -> str:
    return node.name if node is not None else _STANDALONE
