"""A worker's /metrics, read over HTTP after real deliveries on an in-process worker (real
Redis, the fake LLM): taken, finished by outcome, retried, failed, written, tokens, durations,
each sample labelled with the replica's name."""

from __future__ import annotations

import re
import uuid

import httpx

from shared.commands.redisproc import free_port
from shared.store import Store
from tests.builders import task_chat
from tests.fakellm import Failure, FakeLLM
from tests.worker.helpers import enqueue, job_for, running_worker, worker_settings
from worker.app import make_app
from worker.metrics import WorkerMetrics
from worker.runtime import Runtime


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` with (at least) `labels`, 0 when absent."""
    found = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found


def test_a_workers_deliveries_show_on_its_metrics_endpoint(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A job retried after a 429 then written, and one dead-lettered on a 401: three
    deliveries taken, each counted by what it did, tokens of the written summary only."""
    settings = worker_settings(redis_url, fake)
    fake.script(Failure(429, headers={"retry-after": "1.5"}))
    store.conversations.append(tenant, "c1", task_chat(30))
    store.conversations.append(tenant, "c2", task_chat(30, tag="OTHER"))
    runtime = Runtime(settings)
    runtime.check_store()
    app = make_app(settings, runtime=runtime, main=f"test-{uuid.uuid4().hex[:6]}")
    port = free_port()
    try:
        assert runtime.metrics.serve(port, "prefit-worker-7")
        assert not WorkerMetrics().serve(port, None)  # a second process on the port: no endpoint
        with running_worker(app) as runs:
            (written,) = runs.wait([enqueue(app, settings, job_for(store, tenant, "c1", model))])
            fake.script(Failure(401))
            (dead,) = runs.wait([enqueue(app, settings, job_for(store, tenant, "c2", model))])
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        runtime.close()
    assert (written["status"], dead["status"]) == ("written", "dead_letter")
    replica = {"replica": "prefit-worker-7"}
    assert sample(text, "prefit_worker_tasks_taken_total", **replica) == 3
    assert (
        sample(text, "prefit_worker_tasks_retried_total", reason="RetryableLLMError", **replica)
        == 1
    )
    assert sample(text, "prefit_worker_tasks_finished_total", outcome="written") == 1
    assert sample(text, "prefit_worker_tasks_finished_total", outcome="dead_letter") == 1
    assert sample(text, "prefit_worker_tasks_failed_total") == 1
    assert sample(text, "prefit_worker_summaries_written_total") == written["records"] >= 1
    assert (
        sample(text, "prefit_worker_llm_tokens_total", direction="input")
        == (written["input_tokens"])
    )
    assert sample(text, "prefit_worker_llm_tokens_total", direction="output") > 0
    assert sample(text, "prefit_worker_task_seconds_count", outcome="retried") == 1
    assert sample(text, "prefit_worker_task_seconds_count", outcome="written") == 1
    assert sample(text, "prefit_worker_tasks_active") == 0
    assert all('replica="prefit-worker-7"' in line for line in text.splitlines() if "{" in line)
