"""End to end over real HTTP: uvicorn, real Redis, the real Celery worker, the real enqueue,
on the Redis broker and on RabbitMQ."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun

from api.app import create_app
from shared.settings import Settings
from tests.api.conftest import make_settings
from tests.api.helpers import conv_id
from tests.api.server import serve, serve_process
from tests.brokerbackend import new_queue
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts
from tests.worker.helpers import stop_promptly
from tests.worker.processes import end, start_worker_process, worker_env
from worker.app import make_app
from worker.runtime import Runtime

NAME = "mswea_gemini3pro__django__django-13933.json"  # 132 messages, ~46k tokens
WINDOW, RESERVE = 34_000, 2_000


@pytest.fixture
def e2e_settings(request: pytest.FixtureRequest, redis_url: str) -> Settings:
    """The store on the suite's Redis; the broker that Redis, or RabbitMQ with the
    parameter `amqp` (skipped when none answers)."""
    a, b = f"ea-{uuid.uuid4().hex[:8]}", f"eb-{uuid.uuid4().hex[:8]}"
    model = f"model-{uuid.uuid4().hex[:8]}"
    broker = (
        request.getfixturevalue("amqp_url") if getattr(request, "param", "") == "amqp" else None
    )
    named = {"broker_url": broker} if broker else {}  # else the backend's (Redis) broker
    settings = make_settings(
        redis_url, model, api_keys=f"{a}:key-a-{a},{b}:key-b-{b}", chunk_tokens=8000,
        lease_ttl_s=5.0, worker_concurrency=4, summary_queue=new_queue(broker), **named,
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
    and broker: the API's URL, the worker's finished tasks and its runtime (its store)."""
    runtime = Runtime(settings)
    worker = make_app(settings, runtime=runtime)
    finished = Finished(worker)
    task_postrun.connect(finished.on_postrun, weak=False)
    try:
        with (
            start_worker(worker, pool="threads", concurrency=4, perform_ping_check=False,
                         loglevel="WARNING", shutdown_timeout=30) as running,
            serve(create_app(settings)) as url,
        ):  # fmt: skip
            try:
                yield url, finished, runtime
            finally:
                stop_promptly(running)
    finally:
        task_postrun.disconnect(finished.on_postrun)
        runtime.close()


@pytest.fixture
def stack(e2e_settings: Settings) -> Iterator[tuple[str, Settings, Finished]]:
    """The API under uvicorn and an in-process Celery worker (threads) on the same Redis."""
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


def _settled(clients: list[httpx.Client], finished: Callable[[], int]) -> bool:
    """Every job each API scheduled is published, and every published one has run to its end."""
    sent = 0.0
    for client in clients:
        m = client.get("/metrics").text
        published = _total(m, "prefit_summaries_enqueued_total")
        failed = _total(m, "prefit_summary_enqueue_failures_total")
        if _total(m, "prefit_summaries_scheduled_total") != published + failed:
            return False
        sent += published
    return finished() >= sent


def replay(
    urls: list[str], settings: Settings, finished: Callable[[], int], cid: str | None = None
) -> list[Any]:
    """The real transcript appended turn by turn (as `cid`, else a new id), each turn through
    the next API in `urls` and prepared through the one after it; returns each prepare's
    report, the conversation, and each API's metrics.

    The user pauses after each turn until the workers are idle (a deterministic stand-in
    for think time), so what is asserted does not depend on the machine's speed.
    """
    [model] = settings.models
    msgs = load_transcript(TRANSCRIPTS / NAME)["messages"]
    cid = cid or conv_id()
    reports = []
    clients = [_client(url, settings, 0) for url in urls]
    try:
        for i, message in enumerate(msgs):
            r = clients[i % len(clients)].post(
                f"/v1/conversations/{cid}/messages",
                json={"messages": [message], "model": model, "expected_length": i},
            )
            assert r.status_code == 200, r.text
            _wait(lambda: _settled(clients, finished))
            preparing = clients[(i + 1) % len(clients)]
            p = preparing.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
            assert p.status_code == 200, p.text
            reports.append(p.json()["report"])
        info = clients[0].get(f"/v1/conversations/{cid}").json()
        metrics = [c.get("/metrics").text for c in clients]
    finally:
        for client in clients:
            client.close()
    return [reports, info, metrics]


def check_served_from_summaries(reports: list[Any], info: Any, metrics: list[str]) -> None:
    """Each prepare past the trigger found its summary ready; the cut advanced; the summaries
    were all asked for ahead of time, none by a stale prepare."""
    over = [r for r in reports if r["tokens_before"] > r["trigger_tokens"]]
    assert len(over) > 10, "the transcript must outgrow the trigger"
    assert all(r["summary"] is not None and not r["stale"] for r in over)
    final = reports[-1]
    assert final["tokens_after"] <= final["budget"]
    assert {s["summarizer"] for s in info["summaries"]} == {"extractive"}
    assert len(info["summaries"]) >= 2  # the cut advanced as the conversation grew
    assert any(s["upto"] == final["summary"]["upto"] for s in info["summaries"])
    ahead = sum(_total(m, 'prefit_summaries_enqueued_total{kind="ahead"}') for m in metrics)
    assert ahead >= 2
    assert sum(_total(m, 'prefit_summaries_enqueued_total{kind="stale"}') for m in metrics) == 0


@needs_transcripts
@pytest.mark.parametrize("e2e_settings", ["redis", "amqp"], indirect=True)
def test_real_transcript_turn_by_turn_is_served_from_summaries_made_ahead(
    stack: tuple[str, Settings, Finished],
) -> None:
    """Appends trigger the workers; each prepare finds its summary ready; no LLM in prepare.
    The same on either broker: the store's Redis, or RabbitMQ."""
    url, settings, finished = stack
    check_served_from_summaries(*replay([url], settings, finished.count))


@pytest.mark.slow
@needs_transcripts
def test_two_api_processes_and_two_worker_processes_serve_the_same_conversation(
    e2e_settings: Settings, tmp_path: Path
) -> None:
    """Two API processes and two worker processes on one Redis (store and broker): turns go
    to either API, each prepare goes to the other (whose cache must see the other's append),
    both workers compete for the jobs, each job runs once, and every prepare past the trigger
    is served from summaries made ahead."""
    settings = e2e_settings
    env = {
        "PREFIT_API_KEYS": settings.api_keys,
        "PREFIT_MODELS": json.dumps({m: w.model_dump() for m, w in settings.models.items()}),
        "PREFIT_CHUNK_TOKENS": str(settings.chunk_tokens),
        "PREFIT_RETENTION_S": str(settings.retention_s),
    }
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = [start_worker_process(settings, f"w{i}", log, env=env) for i, log in enumerate(logs)]
    try:
        with (
            serve_process({**worker_env(settings, 1), **env}, tmp_path / "api-0.log") as first,
            serve_process({**worker_env(settings, 1), **env}, tmp_path / "api-1.log") as second,
        ):
            found = replay([first, second], settings, lambda: _finished_in(logs))
    finally:
        for proc in workers:
            end(proc)
    check_served_from_summaries(*found)
    sent = sum(_total(m, "prefit_summaries_enqueued_total") for m in found[2])
    assert _finished_in(logs) == sent  # each job run once, by one of the two workers
    assert all(" ready." in log.read_text() for log in logs)  # both were consuming


def _finished_in(logs: list[Path]) -> int:
    """Summary tasks run to their end, as the worker processes logged them."""
    return sum(log.read_text().count('"summary.task_finished"') for log in logs if log.exists())


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
