"""A Redis Cluster with replicas failing over under traffic through the real API: a manual
failover and a SIGKILLed master (which then rejoins as a replica) give no 500, and every
acknowledged append is stored once, in order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from api.app import create_app
from shared.commands.clusterproc import ClusterProcess
from shared.store import Store, keys
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.server import serve
from tests.api.traffic import Traffic, turn

pytestmark = pytest.mark.slow  # failover drills on a cluster of their own: 6-10 s each

CONVERSATIONS = 8
NODE_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    """Three masters with a replica each, noticing a silent master after 1 s."""
    with ClusterProcess(3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as c:
        yield c


@pytest.fixture
def traffic(cluster: ClusterProcess) -> Iterator[tuple[Traffic, Store, str]]:
    """The API on the cluster under uvicorn, and four clients appending to eight conversations."""
    tenant, model = f"fo-{uuid.uuid4().hex[:8]}", f"model-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        cluster.url, model, api_keys=f"{tenant}:{key_of(tenant)}", redis_cluster=True,
        broker_url="redis://127.0.0.1:1/0",  # never used: the test's enqueue records jobs
        request_deadline_s=2.0,  # the default, whatever the cluster pass gives the others
    )  # fmt: skip
    store = Store.from_url(cluster.url, settings)
    convs = [f"c{i}-{uuid.uuid4().hex[:6]}" for i in range(CONVERSATIONS)]
    app = create_app(settings, store=store, enqueue=Recorder())
    try:
        with serve(app) as url:
            headers = {"Authorization": f"Bearer {key_of(tenant)}"}
            t = Traffic(url, headers, model, convs).start()
            try:
                yield t, store, tenant
            finally:
                t.finish()
    finally:
        store.close()


def _check(t: Traffic, store: Store, tenant: str) -> None:
    counts = t.count()
    assert counts[500] == 0, [a for a in t.answers if a.status == 500][:3]
    # every request answered, none refused: a 409 only ever confirms that an append answered
    # 503 ("may have landed": its replica had not acknowledged it in time) did land
    assert set(counts) <= {200, 503, 409} and counts[409] == t.confirmed, counts
    assert sum(t.acknowledged.values()) > 0
    for conv in t.conversations:
        stored = store.conversations.read(tenant, conv)
        n = t.landed.get(conv, 0)
        assert t.acknowledged.get(conv, 0) <= n
        assert stored == [m for i in range(n) for m in turn(conv, i)], conv


def _run_until(t: Traffic, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)


def test_a_manual_failover_under_traffic_gives_no_500_and_loses_nothing(
    cluster: ClusterProcess, traffic: tuple[Traffic, Store, str]
) -> None:
    """CLUSTER FAILOVER of the master of a busy conversation during appends, prepares and GETs:
    no 500, nothing lost or doubled, and the 503s (if any) end once the replica serves."""
    t, store, tenant = traffic
    _run_until(t, 1.0)
    master = cluster.primary_for(keys.conv_messages(tenant, t.conversations[0]))
    cluster.failover(cluster.replica_of(master))
    _run_until(t, 2.0)
    t.finish()
    assert t.count()[200] > 0
    # the redirections were followed within the deadline: a 503 only where a write's WAIT met
    # the demoted primary, so no replica was known to hold it ("may have landed", resent exactly)
    assert [a for a in t.answers if a.status == 503 and a.error != "NotReplicated"] == []
    assert cluster.primary_for(keys.conv_messages(tenant, t.conversations[0])) is not master
    _check(t, store, tenant)


def test_a_killed_master_fails_over_and_rejoins_with_no_500(
    cluster: ClusterProcess, traffic: tuple[Traffic, Store, str]
) -> None:
    """SIGKILL of a master under traffic, then its restart (it rejoins as a replica): no 500,
    nothing acknowledged lost or doubled, no 503 once the replica has taken over."""
    t, store, tenant = traffic
    _run_until(t, 1.0)
    killed = time.monotonic()
    master = cluster.primary_for(keys.conv_messages(tenant, t.conversations[1]))
    replica = cluster.replica_of(master)
    master.kill()
    deadline = time.monotonic() + 15
    while cluster.primary_for(keys.conv_messages(tenant, t.conversations[1])) is not replica:
        assert time.monotonic() < deadline, "the replica did not take over"
        time.sleep(0.05)
    took_over = time.monotonic()
    master.restart()  # its nodes.conf makes it a replica of the new master
    _run_until(t, 2.0)
    t.finish()
    assert t.count(since=took_over + 1.0)[503] == 0
    assert t.count(since=killed)[200] > t.count(since=killed)[503]
    _check(t, store, tenant)
