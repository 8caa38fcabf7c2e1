"""Calibration over HTTP: per tenant, implausible observations refused with 422, nothing
changed by them, and one tenant's reports never move another tenant's counts."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from shared.counting.counters import HeuristicCounter
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.helpers import body, conv_id
from tests.api.test_refusals import dump, same_store, shortened
from tests.builders import chat


def observe(c: TestClient, tenant: str, model: str, msgs: list[Any], factor: float) -> Any:
    actual = round(HeuristicCounter().count(msgs) * factor)
    return c.post(
        "/v1/observe",
        json={**body(msgs, model), "actual_prompt_tokens": actual},
        headers={"Authorization": f"Bearer {key_of(tenant)}"},
    )


def sizes(c: TestClient, tenant: str, model: str, cid: str, msgs: list[Any]) -> tuple[int, ...]:
    """What tenant A is told: GET tokens, stored prepare tokens, stateless prepare tokens."""
    auth = {"Authorization": f"Bearer {key_of(tenant)}"}
    info = c.get(f"/v1/conversations/{cid}", headers=auth).json()
    stored = c.post(f"/v1/conversations/{cid}/prepare", json={"model": model}, headers=auth)
    stateless = c.post("/v1/prepare", json=body(msgs, model), headers=auth)
    return info["tokens"], stored.json()["tokens"], stateless.json()["tokens"]


@pytest.mark.slow
def test_one_tenants_observations_never_move_anothers_counts(
    redis_url: str, store: Store, tenant: str, model: str
) -> None:
    """Tenant B's accepted and refused reports (20 each) leave tenant A's counts unchanged;
    B's refused ones answer 422 and change nothing; B's accepted ones move only B."""
    a, b = tenant, f"{tenant}-b"
    settings = make_settings(redis_url, model, api_keys=f"{a}:{key_of(a)},{b}:{key_of(b)}")
    app: FastAPI = create_app(settings, store=store, enqueue=Recorder())
    msgs = chat(10, size=2000)
    cid = conv_id()
    with TestClient(app, raise_server_exceptions=False) as c:
        for t in (a, b):
            r = c.put(
                f"/v1/conversations/{cid}",
                json=body(msgs, model),
                headers={"Authorization": f"Bearer {key_of(t)}"},
            )
            assert r.status_code == 200
        assert observe(c, a, model, msgs, 1.1).status_code == 204
        time.sleep(1.05)  # past the API's one-second ratio cache
        before = sizes(c, a, model, cid, msgs)
        b_before = sizes(c, b, model, cid, msgs)

        for factor in [0.2, 5.0] * 10:
            dumped = shortened(store.client, b)
            r = observe(c, b, model, msgs, factor)
            assert r.status_code == 422, r.text
            assert r.json()["error"]["type"] == "ImplausibleObservation"
            assert "outside the accepted bounds [0.4, 3.0]" in r.json()["error"]["message"]
            assert same_store(dumped, dump(store.client, b)) == []
        for _ in range(20):
            assert observe(c, b, model, msgs, 2.9).status_code == 204
        time.sleep(1.05)
        after = sizes(c, a, model, cid, msgs)
        b_after = sizes(c, b, model, cid, msgs)
    assert after == before
    assert before[0] > 12_000  # 11.6k base tokens, counted at A's ratio 1.1
    assert b_after[0] > 2.5 * b_before[0]  # B's prompts are cut to fit: only B's


def test_a_report_far_from_a_settled_ratio_is_422_and_changes_nothing(
    redis_url: str, store: Store, tenant: str, model: str, settings: Settings
) -> None:
    """Once settled (here after 5 reports) a report more than 1.5x away is refused."""
    quick = settings.model_copy(update={"calibration_settle_after": 5})
    app = create_app(quick, store=Store.from_url(redis_url, quick), enqueue=Recorder())
    msgs = chat(4)
    with TestClient(app, raise_server_exceptions=False) as c:
        for _ in range(5):
            assert observe(c, tenant, model, msgs, 1.0).status_code == 204
        dumped = shortened(store.client, tenant)
        r = observe(c, tenant, model, msgs, 1.6)
        assert r.status_code == 422
        assert "more than 1.5x away from the settled ratio 1.000" in r.json()["error"]["message"]
        assert same_store(dumped, dump(store.client, tenant)) == []
        assert observe(c, tenant, model, msgs, 1.4).status_code == 204
