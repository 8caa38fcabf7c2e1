"""Writes acknowledged only once replicated: a real primary/replica pair, killed and frozen."""

from __future__ import annotations

import contextvars
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from shared.commands.clusterproc import ClusterProcess
from shared.commands.redisproc import RedisProcess
from shared.errors import LengthMismatch, NotReplicated
from shared.hashing import prefix_hashes
from shared.settings import Settings
from shared.store import Replication, Store, keys
from shared.store.client import retry_within
from shared.store.replication import Acks, healthy_replicas
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.conftest import RETENTION_S
from tests.redisbackend import require_cluster, require_redis_server

R = TypeVar("R")


def within(seconds: float, fn: Callable[[], R]) -> R:
    """`fn()` as inside a request with `seconds` left (in a context of its own)."""

    def run() -> R:
        until = time.monotonic() + seconds
        retry_within(lambda: until - time.monotonic())
        return fn()

    return contextvars.copy_context().run(run)


def wait_synced(primary: RedisProcess, replicas: int = 1, timeout: float = 10) -> None:
    client = redis.Redis.from_url(primary.url)
    deadline = time.monotonic() + timeout
    try:
        while healthy_replicas(client.info("replication")) < replicas:
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.02)
    finally:
        client.close()


@pytest.fixture
def pair() -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A throwaway primary and its replica, in sync."""
    require_redis_server()
    with RedisProcess(options=["--repl-diskless-sync-delay", "0"]) as primary:
        replica = RedisProcess(options=["--replicaof", "127.0.0.1", str(primary.port)])
        with replica:
            wait_synced(primary)
            yield primary, replica


def settings(**kw: Any) -> Settings:
    return Settings(retention_s=RETENTION_S, **kw)


def test_healthy_replicas_counts_only_online_acknowledging_ones() -> None:
    """A replica still syncing, or silent for over 2 s, is not waited for."""
    info = {
        "role": "master",
        "connected_slaves": 3,
        "slave0": {"ip": "10.0.0.1", "state": "online", "lag": 0},
        "slave1": {"ip": "10.0.0.2", "state": "wait_bgsave", "lag": 0},
        "slave2": {"ip": "10.0.0.3", "state": "online", "lag": 9},
    }
    assert healthy_replicas(info) == 1
    assert healthy_replicas({"role": "master", "connected_slaves": 0}) == 0


def test_a_primary_without_replicas_is_never_waited_for(redis_url: str) -> None:
    """Unset, the setting waits for no replica where there is none: no WAIT is queued."""
    store = Store.from_url(redis_url, settings())
    try:
        auto = Replication(store.client, min_acks=None, socket_timeout_s=2.0)
        pipe = store.client.pipeline(transaction=False)
        assert auto.wait_in(pipe, keys.conv_messages("t", "c")) is None
        assert len(pipe) == 0
    finally:
        store.close()


def test_acknowledged_writes_survive_a_primary_killed_right_after(
    pair: tuple[RedisProcess, RedisProcess], tenant: str
) -> None:
    """Appends, a PUT and a summary record, each killed-after-ack on the primary: the promoted
    replica has every one of them."""
    primary, replica = pair
    store = Store.from_url(primary.url, settings())
    msgs = numbered_chat(40)
    try:
        store.conversations.replace(tenant, "put", msgs[:10])
        for i in range(0, 40, 2):
            within(2.0, lambda i=i: store.conversations.append(tenant, "c", msgs[i : i + 2]))
        h = prefix_hashes(msgs)[20]
        store.records.put(tenant, "c", SummaryRecord(20, h, "summary text"))
    finally:
        primary.kill()  # right after the last acknowledgment
        store.close()
    promoted = redis.Redis.from_url(replica.url)
    promoted.execute_command("REPLICAOF", "NO", "ONE")
    promoted.close()
    survivor = Store.from_url(replica.url, settings())
    try:
        assert survivor.conversations.read(tenant, "c") == msgs
        assert survivor.conversations.hashes(tenant, "c") == prefix_hashes(msgs)
        assert survivor.conversations.read(tenant, "put") == msgs[:10]
        assert [r.upto for r in survivor.records.list(tenant, "c")] == [20]
    finally:
        survivor.close()


def test_a_write_no_replica_acknowledges_answers_may_have_landed(
    pair: tuple[RedisProcess, RedisProcess], tenant: str
) -> None:
    """With the replica frozen an append is not acknowledged: `NotReplicated` within the
    deadline, saying it may have landed; it did, so the retry with `expected_length` is
    refused exactly, and nothing lands twice."""
    primary, replica = pair
    store = Store.from_url(primary.url, settings(redis_min_replicas_ack=1))
    msgs = numbered_chat(4)
    assert replica.pid is not None
    try:
        store.conversations.append(tenant, "c", msgs[:2], expected_length=0)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(NotReplicated, match="may have landed"):
                within(
                    0.8,
                    lambda: store.conversations.append(tenant, "c", msgs[2:], expected_length=2),
                )
            assert time.monotonic() - started < 0.8
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        with pytest.raises(LengthMismatch):
            store.conversations.append(tenant, "c", msgs[2:], expected_length=2)
        assert store.conversations.read(tenant, "c") == msgs
    finally:
        store.close()


def test_a_write_unacknowledged_when_its_primary_dies_is_resent_exactly(
    pair: tuple[RedisProcess, RedisProcess], tenant: str
) -> None:
    """The replica frozen, an append answers `NotReplicated` (without the WAIT it would have
    been acknowledged); the primary is killed and the replica promoted: it holds every
    acknowledged message, the unacknowledged one or not ("may have landed": the replica may
    still read it from its socket), and the client's retry with `expected_length` makes the
    conversation exactly what it sent."""
    primary, replica = pair
    store = Store.from_url(primary.url, settings())
    msgs = numbered_chat(6)
    assert replica.pid is not None
    try:
        store.conversations.append(tenant, "c", msgs[:4], expected_length=0)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated):
                within(
                    0.5,
                    lambda: store.conversations.append(tenant, "c", msgs[4:], expected_length=4),
                )
            primary.kill()
        finally:
            os.kill(replica.pid, signal.SIGCONT)
    finally:
        store.close()
    promoted = redis.Redis.from_url(replica.url)
    promoted.execute_command("REPLICAOF", "NO", "ONE")
    promoted.close()
    survivor = Store.from_url(replica.url, settings())
    try:
        assert survivor.conversations.read(tenant, "c") in (msgs[:4], msgs)
        try:
            survivor.conversations.append(tenant, "c", msgs[4:], expected_length=4)
        except LengthMismatch as exc:
            assert exc.actual == 6  # it had landed
        assert survivor.conversations.read(tenant, "c") == msgs
    finally:
        survivor.close()


def test_claims_and_records_wait_too(pair: tuple[RedisProcess, RedisProcess], tenant: str) -> None:
    """A job's claim and its record write are not acknowledged while no replica has them."""
    primary, replica = pair
    store = Store.from_url(primary.url, settings(redis_min_replicas_ack=1))
    msgs = numbered_chat(6)
    assert replica.pid is not None
    try:
        store.conversations.append(tenant, "c", msgs)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated):
                within(0.5, lambda: store.claims.claim(tenant, "c", "worker-1", 5.0))
            record = SummaryRecord(4, prefix_hashes(msgs)[4], "summary")
            with pytest.raises(NotReplicated):
                within(0.5, lambda: store.claims.commit(tenant, "c", record, (1, 1, 0.0)))
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert store.claims.claim(tenant, "c", "worker-2", 5.0).held is None  # worker-1 has it
    finally:
        store.close()


@pytest.mark.slow
def test_on_a_cluster_a_killed_master_loses_no_acknowledged_append(tenant: str) -> None:
    """A cluster of 3 masters with a replica each: every append acknowledged before its
    master's SIGKILL is on the replica that takes over."""
    require_cluster()
    with ClusterProcess(3, replicas=1) as cluster:
        cluster.wait_synced(10)
        store = Store.from_url(cluster.url, settings(redis_cluster=True, broker_url="redis://x"))
        msgs = numbered_chat(30)
        try:
            for i in range(0, 30, 3):
                within(2.0, lambda i=i: store.conversations.append(tenant, "c", msgs[i : i + 3]))
            master = cluster.primary_for(keys.conv_messages(tenant, "c"))
            replica = cluster.replica_of(master)
            master.kill()
            deadline = time.monotonic() + 15
            while cluster.primary_for(keys.conv_messages(tenant, "c")) is not replica:
                assert time.monotonic() < deadline, "the replica did not take over"
                time.sleep(0.05)
            assert within(2.0, lambda: store.conversations.read(tenant, "c")) == msgs
        finally:
            store.close()


class _Replied:
    """A pipeline that has already run: `execute` gives `replies`, errors as values."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert not raise_on_error  # the WAIT's error must come back as a reply
        return list(self.replies)


def test_a_wait_refused_by_a_demoted_primary_is_not_replicated(redis_url: str) -> None:
    """The write went to the new primary and its WAIT to the old one, now a replica: the
    write may have landed, so the answer is NotReplicated, never a crash."""
    client = redis.Redis.from_url(redis_url)
    try:
        replication = Replication(client, min_acks=1, socket_timeout_s=1.0)
        acks = Acks(1, "old-primary", 100)
        refused = redis.ResponseError("WAIT cannot be used with replica instances.")
        replies = replication.execute(_Replied(1, refused), acks)
        assert replies == [1, 0]
        with pytest.raises(NotReplicated):
            replication.check(acks, replies[-1])
        with pytest.raises(redis.ResponseError):  # the write's own error stays the write's
            replication.execute(_Replied(redis.ResponseError("ERR script"), 1), acks)
    finally:
        client.close()
