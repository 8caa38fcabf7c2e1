"""End to end over real HTTP: uvicorn, real Redis, the real Celery worker, the real enqueue."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun

from api.app import create_app
from shared.settings import Settings
from tests.api.conftest import make_settings
from tests.api.helpers import conv_id
from tests.api.server import serve
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts
from worker.app import make_app
from worker.runtime import Runtime

NAME = "mswea_gemini3pro__django__django-13933.json"  # 132 messages, ~46k tokens
WINDOW, RESERVE = 34_000, 2_000


@pytest.fixture
def e2e_settings(redis_url: str) -> Settings:
    a, b = f"ea-{uuid.uuid4().hex[:8]}", f"eb-{uuid.uuid4().hex[:8]}"
    model = f"model-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        redis_url, model, api_keys=f"{a}:key-a-{a},{b}:key-b-{b}", chunk_tokens=8000,
        lease_ttl_s=5.0, worker_concurrency=4,
    )  # fmt: skip
    settings.models[model].max_input_tokens = WINDOW
    settings.models[model].reserve_output = RESERVE
    return settings


class Finished:
    """Task ids of the worker app that ran to an end in this process (Celery signals)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ids: set[str] = set()
        self.lock = threading.Lock()

    def on_postrun(self, sender: Any = None, task_id: str = "", state: str = "", **_: Any) -> None:
        if getattr(sender, "app", None) is self.app and state in ("SUCCESS", "FAILURE"):
            with self.lock:
                self.ids.add(task_id)

    def count(self) -> int:
        with self.lock:
            return len(self.ids)


@contextmanager
def api_and_worker(settings: Settings) -> Iterator[tuple[str, Finished, Runtime]]:
    """The API under uvicorn and an in-process Celery worker (threads) on `settings`' store
    and broker; the worker checks its store first, as `prefit worker` does."""
    runtime = Runtime(settings)
    runtime.check_store()
    worker = make_app(settings, runtime=runtime)
    finished = Finished(worker)
    task_postrun.connect(finished.on_postrun, weak=False)
    try:
        with (
            start_worker(worker, pool="threads", concurrency=4, perform_ping_check=False,
                         loglevel="WARNING", shutdown_timeout=30),
            serve(create_app(settings)) as url,
        ):  # fmt: skip
            yield url, finished, runtime
    finally:
        task_postrun.disconnect(finished.on_postrun)
        runtime.close()


@pytest.fixture
def stack(e2e_settings: Settings) -> Iterator[tuple[str, Settings, Finished]]:
    """The API and a worker on the same Redis."""
    with api_and_worker(e2e_settings) as (url, finished, _):
        yield url, e2e_settings, finished


def _client(url: str, settings: Settings, which: int) -> httpx.Client:
    _tenant, key = settings.api_keys.split(",")[which].split(":")
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _wait(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _total(metrics: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name)
    )


def _settled(client: httpx.Client, finished: Finished) -> bool:
    """Every job the API claimed is published, and every published one has run to its end."""
    m = client.get("/metrics").text
    claimed = _total(m, "prefit_summary_claims_total")
    sent = _total(m, "prefit_summaries_enqueued_total")
    done = sent + _total(m, "prefit_summary_enqueue_failures_total")
    return claimed == done and finished.count() >= sent


def append_turn_by_turn(
    client: httpx.Client, finished: Finished, cid: str, model: str, msgs: list[Any]
) -> list[dict[str, Any]]:
    """Each message appended, the workers left to finish, then a prepare: its reports."""
    reports = []
    for i, message in enumerate(msgs):
        r = client.post(
            f"/v1/conversations/{cid}/messages",
            json={"messages": [message], "model": model, "expected_length": i},
        )
        assert r.status_code == 200, r.text
        _wait(lambda: _settled(client, finished))
        p = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
        assert p.status_code == 200, p.text
        reports.append(p.json()["report"])
    return reports


@needs_transcripts
def test_real_transcript_turn_by_turn_is_served_from_summaries_made_ahead(
    stack: tuple[str, Settings, Finished],
) -> None:
    """Appends trigger the workers; each prepare finds its summary ready; no LLM in prepare.

    The user pauses after each turn until the workers are idle (a deterministic stand-in
    for think time), so what is asserted does not depend on the machine's speed.
    """
    url, settings, finished = stack
    [model] = settings.models
    msgs = load_transcript(TRANSCRIPTS / NAME)["messages"]
    cid = conv_id()
    with _client(url, settings, 0) as client:
        reports = append_turn_by_turn(client, finished, cid, model, msgs)
        info = client.get(f"/v1/conversations/{cid}").json()
        metrics = client.get("/metrics").text
    over = [r for r in reports if r["tokens_before"] > r["trigger_tokens"]]
    assert len(over) > 10, "the transcript must outgrow the trigger"
    assert all(r["summary"] is not None and not r["stale"] for r in over)
    final = reports[-1]
    assert final["tokens_after"] <= final["budget"]
    assert {s["summarizer"] for s in info["summaries"]} == {"extractive"}
    assert len(info["summaries"]) >= 2  # the cut advanced as the conversation grew
    assert any(s["upto"] == final["summary"]["upto"] for s in info["summaries"])
    assert _total(metrics, 'prefit_summaries_enqueued_total{kind="ahead"}') >= 2
    assert _total(metrics, 'prefit_summaries_enqueued_total{kind="stale"}') == 0


def test_tenant_b_gets_404_for_tenant_a_over_http(stack: tuple[str, Settings, Finished]) -> None:
    """Identical content in two tenants stays two conversations; B cannot reach A's."""
    url, settings, _ = stack
    [model] = settings.models
    cid = conv_id()
    msgs = [{"role": "user", "content": "same words"}, {"role": "assistant", "content": "same"}]
    with _client(url, settings, 0) as a, _client(url, settings, 1) as b:
        assert (
            a.post(
                f"/v1/conversations/{cid}/messages", json={"messages": msgs, "model": model}
            ).status_code
            == 200
        )
        assert b.get(f"/v1/conversations/{cid}").status_code == 404
        assert b.post(f"/v1/conversations/{cid}/prepare", json={"model": model}).status_code == 404
        unknown = httpx.get(f"{url}/v1/conversations/{cid}", headers={"Authorization": "Bearer x"})
        assert unknown.status_code == 401
