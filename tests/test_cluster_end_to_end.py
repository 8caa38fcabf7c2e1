"""End to end on a Redis Cluster store: a real transcript appended turn by turn over HTTP,
summaries made ahead by a real Celery worker, prepare served from them; then a fork reusing
them through the tenant's directory, a stateless prepare finding them, and deletes that
leave nothing behind. The broker is a standalone Redis (kombu has no cluster transport)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from shared import keys
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import make_settings
from tests.api.test_end_to_end import (
    Finished,
    _client,
    _settled,
    _total,
    _wait,
    api_and_worker,
    append_turn_by_turn,
)
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts
from tests.shared.store.helpers import tenant_keys

NAME = "mswea_gemini3pro__django__django-13933.json"  # 132 messages, ~46k tokens
WINDOW, RESERVE = 34_000, 2_000
FORK_AT = 100  # the fork resends the first 100 messages as its own conversation

Stack = tuple[str, Settings, Finished, Store]


@pytest.fixture
def stack(cluster_url: str, standalone_url: str) -> Iterator[Stack]:
    """The API under uvicorn and an in-process Celery worker, both on the cluster store."""
    tenant, model = f"ec-{uuid.uuid4().hex[:8]}", f"model-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        cluster_url, model, api_keys=f"{tenant}:key-{tenant}", chunk_tokens=8000,
        lease_ttl_s=5.0, worker_concurrency=4, redis_cluster=True, broker_url=standalone_url,
    )  # fmt: skip
    settings.models[model].max_input_tokens = WINDOW
    settings.models[model].reserve_output = RESERVE
    with api_and_worker(settings) as (url, finished, runtime):
        yield url, settings, finished, runtime.store


@needs_transcripts
def test_a_transcript_on_a_cluster_store_is_served_from_summaries_made_ahead(
    stack: Stack,
) -> None:
    """Every prepare over the trigger is served from a ready summary (never stale); a fork
    reuses the records without a summary of its own; deletes leave no key behind."""
    url, settings, finished, store = stack
    [model] = settings.models
    tenant = settings.api_keys.split(":")[0]
    msgs = load_transcript(TRANSCRIPTS / NAME)["messages"]
    cid, fork = f"c-{uuid.uuid4().hex[:8]}", f"f-{uuid.uuid4().hex[:8]}"
    with _client(url, settings, 0) as client:
        reports = append_turn_by_turn(client, finished, cid, model, msgs)
        info = client.get(f"/v1/conversations/{cid}").json()
        made = store.usage.get(tenant).summaries

        # a fork: the same first messages, resent whole as another conversation
        r = client.put(
            f"/v1/conversations/{fork}", json={"messages": msgs[:FORK_AT], "model": model}
        )
        assert r.status_code == 200, r.text
        _wait(lambda: _settled(client, finished))
        forked = client.get(f"/v1/conversations/{fork}").json()

        # a stateless prepare of the whole transcript finds the records too
        whole = client.post("/v1/prepare", json={"messages": msgs, "model": model})
        assert whole.status_code == 200, whole.text
        metrics = client.get("/metrics").text
        for conv in (cid, fork):
            assert client.delete(f"/v1/conversations/{conv}").status_code == 204
    over = [r for r in reports if r["tokens_before"] > r["trigger_tokens"]]
    assert len(over) > 10, "the transcript must outgrow the trigger"
    assert all(r["summary"] is not None and not r["stale"] for r in over)
    assert len(info["summaries"]) >= 2 and made == len(info["summaries"])
    assert _total(metrics, 'prefit_summaries_enqueued_total{kind="stale"}') == 0

    reused = {s["prefix_hash"] for s in forked["summaries"]}
    assert reused and reused <= {s["prefix_hash"] for s in info["summaries"]}
    assert store.usage.get(tenant).summaries == made  # copied, not summarized again
    assert whole.json()["report"]["summary"]["upto"] == reports[-1]["summary"]["upto"]

    # no text, no record, no copy left (enqueue markers and leases just expire: ids only)
    left = tenant_keys(store.client, tenant)
    text = (":msgs", ":hashes", ":meta", ":summaries", ":tally")
    assert [k for k in left if k.endswith(text) or ":rec:" in k or ":dir:" in k] == []
    assert keys.usage(tenant) in left
