"""Redis going away: stateless prepare degrades, stateful routes answer 503, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.commands.redisproc import RedisProcess
from tests.api.conftest import Recorder, make_settings
from tests.api.helpers import body, conv_id
from tests.builders import chat, user
from tests.redisbackend import require_redis_server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis of this test's own, persisted so a restart keeps its data."""
    require_redis_server()
    proc = RedisProcess(appendonly=True, dir=tmp_path)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_redis_down_degrades_or_503_never_500(own_redis: RedisProcess, model: str) -> None:
    """With Redis stopped: stateless prepare degrades, the rest is 503 + Retry-After."""
    app = create_app(make_settings(own_redis.url, model), enqueue=Recorder())
    cid = conv_id()
    msgs = chat(12, size=4000)
    with TestClient(app, raise_server_exceptions=False) as c:
        assert (
            c.post(f"/v1/conversations/{cid}/messages", json=body(msgs, model)).status_code == 200
        )
        own_redis.stop()
        r = c.post("/v1/prepare", json=body(msgs, model))
        assert r.status_code == 200
        assert r.json()["report"]["degraded"] is True
        assert r.json()["tokens"] <= r.json()["report"]["budget"]
        calls = [
            c.post(f"/v1/conversations/{cid}/messages", json=body([user("x")], model)),
            c.put(f"/v1/conversations/{cid}", json=body(msgs, model)),
            c.get(f"/v1/conversations/{cid}"),
            c.delete(f"/v1/conversations/{cid}"),
            c.post(f"/v1/conversations/{cid}/prepare", json={"model": model}),
            c.post("/v1/observe", json={**body(msgs, model), "actual_prompt_tokens": 10}),
        ]
        for r in calls:
            assert r.status_code == 503, (r.request.method, r.request.url, r.text)
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "StoreUnavailable"
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["redis"] is False
        assert c.get("/healthz").status_code == 200
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "prefit_store_up 0.0" in metrics.text

        own_redis.restart()
        r = c.post(f"/v1/conversations/{cid}/messages", json=body([user("back")], model))
        assert r.status_code == 200 and r.json()["length"] == len(msgs) + 1
        assert c.get("/readyz").status_code == 200


def test_broker_down_is_not_ready(own_redis: RedisProcess, model: str) -> None:
    """/readyz names the broker when it cannot be reached."""
    settings = make_settings(own_redis.url, model, broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings, enqueue=Recorder())) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["broker"] is False and r.json()["redis"] is True
    assert "broker" in r.json()["error"]["message"]
