"""Error shapes, the one canonical log line per request (never content), and the metrics."""

from __future__ import annotations

import time
import uuid

import pytest
import structlog
from fastapi.testclient import TestClient

from api.app import create_app
from api.conversations import Conversations
from shared.hashing import prefix_hash
from shared.store import Store
from shared.summaries.book import SummaryRecord
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.helpers import body, conv_id
from tests.builders import chat, user

SECRET = "SECRET-CONTENT-7731"


def test_bad_json_is_400(client: TestClient) -> None:
    """A body that is not JSON gets 400 with a typed error."""
    r = client.post(
        "/v1/prepare", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "InvalidTranscript"
    assert "not valid JSON" in r.json()["error"]["message"]


def test_schema_violations_are_422_naming_the_field(client: TestClient, model: str) -> None:
    """Missing fields, unknown fields and non-object messages are precise 422s."""
    r = client.post("/v1/prepare", json={"messages": []})
    assert r.status_code == 422 and r.json()["error"]["type"] == "InvalidRequest"
    assert r.json()["error"]["message"].startswith("model:")
    r = client.post("/v1/prepare", json={**body([], model), "expected_lenght": 3})
    assert r.status_code == 422 and "expected_lenght" in r.json()["error"]["message"]
    r = client.post("/v1/prepare", json=body([user("a"), "oops"], model))  # type: ignore[list-item]
    assert r.status_code == 422 and r.json()["error"]["index"] == 1


def test_unknown_route_is_404_in_the_error_shape(client: TestClient) -> None:
    """Even the framework's own 404 uses the error shape."""
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound"


def test_a_bug_is_a_logged_500_without_details(
    client: TestClient, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception is logged by type and stack (not message) and answered 500."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(Conversations, "info", broken)
    with structlog.testing.capture_logs() as logs:
        r = client.get(f"/v1/conversations/{conv_id()}")
    assert r.status_code == 500 and SECRET not in r.text
    [crash] = [e for e in logs if e["event"] == "request.crashed"]
    assert crash["error"] == "RuntimeError" and any("broken" in f for f in crash["frames"])
    assert SECRET not in repr(logs)
    # on a terminal the console renderer takes a `stack` key for a string to append
    assert "request.crashed" in structlog.dev.ConsoleRenderer(colors=False)(None, "error", crash)


def test_one_canonical_line_per_request_without_content(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """Each request logs one request.completed line of ids and counts; no text, no key."""
    cid = conv_id()
    msgs = [*chat(12, size=4000), user(SECRET)]
    with structlog.testing.capture_logs() as logs:
        client.post(f"/v1/conversations/{cid}/messages", json=body(msgs, model))
        store.records.put(tenant, cid, SummaryRecord(19, prefix_hash(msgs[:19]), SECRET))
        client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
        client.post("/v1/prepare", json=body([user(SECRET)], model))
    lines = [e for e in logs if e["event"] == "request.completed"]
    assert len(lines) == 3
    append, prepare, stateless = lines
    assert append["route"] == "/v1/conversations/{conversation_id}/messages"
    assert (append["status"], append["tenant"], append["conversation_id"]) == (200, tenant, cid)
    assert append["latency_ms"] > 0 and append["length"] == 26
    assert prepare["route"] == "/v1/conversations/{conversation_id}/prepare"
    assert prepare["summary_hit"] is True and "Summarize" in prepare["strategies"]
    assert stateless["route"] == "/v1/prepare" and stateless["degraded"] is False
    dump = repr(logs)
    assert SECRET not in dump and key_of(tenant) not in dump


def test_metrics_count_latency_strategies_summaries_and_errors(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """/metrics exposes prepare/append latency, strategies, summary hits and misses, errors."""
    cid = conv_id()
    msgs = chat(12, size=4000)
    client.post(f"/v1/conversations/{cid}/messages", json=body(msgs, model))
    client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})  # stale: a miss
    store.records.put(tenant, cid, SummaryRecord(19, prefix_hash(msgs[:19]), "s"))
    client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})  # a hit
    client.get(f"/v1/conversations/{conv_id()}")  # a NotFound
    text = client.get("/metrics").text
    assert 'prefit_prepare_seconds_count{kind="stored"} 2.0' in text
    assert "prefit_append_seconds_count 1.0" in text
    assert 'prefit_summary_lookups_total{result="hit"} 1.0' in text
    assert 'prefit_summary_lookups_total{result="miss"} 1.0' in text
    assert 'prefit_strategies_applied_total{strategy="Summarize"} 1.0' in text
    assert "prefit_stale_prepares_total 1.0" in text
    assert 'prefit_errors_total{type="NotFound"} 1.0' in text
    assert 'prefit_summaries_enqueued_total{kind="stale"} 1.0' in text
    assert "prefit_store_up 1.0" in text and "prefit_summary_queue_depth 0.0" in text
    assert 'prefit_llm_tokens_total{direction="input"} 0.0' in text
    assert tenant not in text  # tenant names need the metrics token


def test_metrics_name_tenants_only_for_the_metrics_token(
    redis_url: str, store: Store, tenant: str, model: str
) -> None:
    """Without PREFIT_METRICS_TOKEN a scrape sees LLM usage summed over tenants and no tenant
    name; with it, per-tenant series too; a wrong token is 401."""
    other = f"{tenant}-b"
    keys_spec = f"{tenant}:{key_of(tenant)},{other}:{key_of(other)}"
    store.usage.add(tenant, 100, 10, 0.5)
    store.usage.add(other, 20, 2, 0.25)
    settings = make_settings(redis_url, model, api_keys=keys_spec, metrics_token="scrape-me")
    with TestClient(create_app(settings, store=store, enqueue=Recorder())) as c:
        public = c.get("/metrics")
        assert public.status_code == 200
        assert 'prefit_llm_tokens_total{direction="input"} 120.0' in public.text
        assert "prefit_llm_cost_usd_total 0.75" in public.text
        assert tenant not in public.text and "prefit_tenant_" not in public.text
        assert c.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        full = c.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert full.status_code == 200 and "scrape-me" not in full.text
        assert (
            f'prefit_tenant_llm_tokens_total{{direction="input",tenant="{tenant}"}} 100.0'
            in full.text
        )
        assert f'prefit_tenant_llm_cost_usd_total{{tenant="{other}"}} 0.25' in full.text
    unset = make_settings(redis_url, model, api_keys=keys_spec)
    with TestClient(create_app(unset, store=store, enqueue=Recorder())) as c:
        text = c.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).text
        assert tenant not in text and 'prefit_llm_tokens_total{direction="input"} 120.0' in text


def test_an_open_summarizer_breaker_shows_in_readyz_and_metrics_yet_ready(
    client: TestClient, store: Store
) -> None:
    """The workers' breaker is detail: /readyz stays 200 naming it, /metrics has its gauge."""
    provider = f"p{uuid.uuid4().hex[:12]}"
    label = f"openai:{provider}"
    store.breakers.trip(provider, label, "LLMError: openai: HTTP 401")
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    summarizer = r.json()["summarizer"]
    assert summarizer["state"] == "open" and summarizer["until"] > time.time()
    (mine,) = [p for p in summarizer["providers"] if p["label"] == label]
    assert mine["state"] == "open" and mine["failures"] == 1
    metrics = client.get("/metrics").text
    assert f'prefit_summarizer_breaker_open{{provider="{label}"}} 1.0' in metrics
    store.breakers.reset(provider)
    gauge = f'prefit_summarizer_breaker_open{{provider="{label}"}} 0.0'
    assert gauge in client.get("/metrics").text
