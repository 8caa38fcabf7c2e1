"""End to end on a Redis Cluster store with RabbitMQ as the broker (kombu has no cluster
transport): a real transcript appended turn by turn over HTTP, summaries made ahead by a
real Celery worker, prepare served from them; then a fork reusing them through the tenant's
directory, a stateless prepare finding them, and deletes that leave nothing behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from shared.settings import Settings
from shared.store import Store, keys
from tests.api.conftest import make_settings
from tests.api.test_end_to_end import (
    NAME,
    RESERVE,
    WINDOW,
    Finished,
    _client,
    _settled,
    _total,
    _wait,
    api_and_worker,
    check_served_from_summaries,
    replay,
)
from tests.brokerbackend import new_queue
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts
from tests.shared.store.helpers import tenant_keys

pytestmark = pytest.mark.slow  # a cluster, RabbitMQ and a worker, turn by turn: about 2 s

FORK_AT = 100  # the fork resends the first 100 messages as its own conversation

Stack = tuple[str, Settings, Finished, Store]


@pytest.fixture
def stack(cluster_url: str, amqp_url: str) -> Iterator[Stack]:
    """The API under uvicorn and an in-process Celery worker: the store on the cluster, the
    summary queue on RabbitMQ (a queue of the test's own)."""
    tenant, model = f"ec-{uuid.uuid4().hex[:8]}", f"model-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        cluster_url, model, api_keys=f"{tenant}:key-{tenant},other:key-other-{tenant}",
        chunk_tokens=8000, lease_ttl_s=5.0, worker_concurrency=4, redis_cluster=True,
        broker_url=amqp_url, summary_queue=new_queue(amqp_url),
    )  # fmt: skip
    settings.models[model].max_input_tokens = WINDOW
    settings.models[model].reserve_output = RESERVE
    with api_and_worker(settings) as (url, finished, runtime):
        yield url, settings, finished, runtime.store


@needs_transcripts
def test_a_transcript_on_a_cluster_store_and_rabbitmq_is_served_from_summaries_made_ahead(
    stack: Stack,
) -> None:
    """Every prepare over the trigger is served from a ready summary (never stale); a fork
    reuses the records without a summary of its own; deletes leave no key behind."""
    url, settings, finished, store = stack
    [model] = settings.models
    tenant = settings.api_keys.split(":")[0]
    msgs = load_transcript(TRANSCRIPTS / NAME)["messages"]
    cid, fork = f"c-{uuid.uuid4().hex[:8]}", f"f-{uuid.uuid4().hex[:8]}"
    reports, info, metrics = replay([url], settings, finished.count, cid)
    check_served_from_summaries(reports, info, metrics)
    made = store.usage.get(tenant).summaries
    assert made == len(info["summaries"])
    with _client(url, settings, 0) as client:
        # a fork: the same first messages, resent whole as another conversation
        r = client.put(
            f"/v1/conversations/{fork}", json={"messages": msgs[:FORK_AT], "model": model}
        )
        assert r.status_code == 200, r.text
        _wait(lambda: _settled([client], finished.count))
        forked = client.get(f"/v1/conversations/{fork}").json()
        # a stateless prepare of the whole transcript finds the records too
        whole = client.post("/v1/prepare", json={"messages": msgs, "model": model})
        assert whole.status_code == 200, whole.text
        after = client.get("/metrics").text
        for conv in (cid, fork):
            assert client.delete(f"/v1/conversations/{conv}").status_code == 204
    assert _total(after, 'prefit_summaries_enqueued_total{kind="stale"}') == 0
    reused = {s["prefix_hash"] for s in forked["summaries"]}
    assert reused and reused <= {s["prefix_hash"] for s in info["summaries"]}
    assert store.usage.get(tenant).summaries == made  # copied, not summarized again
    assert whole.json()["report"]["summary"]["upto"] == reports[-1]["summary"]["upto"]

    # no text, no record, no copy left (pending-job markers and leases just expire: ids only)
    left = tenant_keys(store.client, tenant)
    text = (":msgs", ":hashes", ":meta", ":summaries", ":tally")
    assert [k for k in left if k.endswith(text) or ":rec:" in k or ":dir:" in k] == []
    assert keys.usage(tenant) in left
