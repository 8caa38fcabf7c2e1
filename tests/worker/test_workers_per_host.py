"""Two worker processes on one host, started by the production command line with its default
node names: on RabbitMQ and on Redis both consume and both make summaries, and neither dies
on the other's pidbox queue (RESOURCE_LOCKED)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from shared.commands.up import worker_argv
from shared.settings import Settings
from shared.store import Store
from tests.brokerbackend import new_queue
from tests.builders import task_chat
from tests.conftest import ROOT
from tests.fakellm import FakeLLM
from tests.worker.helpers import enqueue, job_for, wait_until, worker_settings
from tests.worker.processes import end, worker_env
from worker.app import make_app

JOBS = 4
READY = re.compile(r"(prefit-[0-9a-f]{8}@\S+) ready")


def _two_workers(settings: Settings, tmp_path: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    started = []
    for i in range(2):
        log = tmp_path / f"w{i}.log"
        argv = [*worker_argv(settings, 1), "-l", "INFO"]  # no -n: the default node name
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=worker_env(settings, 1), stdout=out, stderr=subprocess.STDOUT
            )
        started.append((proc, log))
    return started


def _wrote(log: str) -> bool:
    """Whether a worker's JSON log has a job that wrote a record."""
    lines = (json.loads(line) for line in log.splitlines() if line.startswith("{"))
    return any(
        e.get("event") == "summary.task_finished" and e.get("status") == "written" for e in lines
    )


@pytest.mark.slow  # two cold worker processes per broker: about 15-20 s each
@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_two_workers_on_one_host_both_make_summaries(
    broker: str,
    request: pytest.FixtureRequest,
    store: Store,
    redis_url: str,
    tenant: str,
    model: str,
    tmp_path: Path,
) -> None:
    """Four jobs that each hold a worker for a second, two single-threaded workers with the
    default names: both stay up, both compute summaries, every job gets its record."""
    url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    with FakeLLM(delay=1.0) as fake:
        settings = worker_settings(redis_url, fake, broker_url=url, summary_queue=new_queue(url))
        convs = [f"c{i}" for i in range(JOBS)]
        for conv in convs:
            store.conversations.append(tenant, conv, task_chat(30, tag=conv))
        workers = _two_workers(settings, tmp_path)
        try:
            app = make_app(settings)
            for conv in convs:
                enqueue(app, settings, job_for(store, tenant, conv, model))
            wait_until(
                lambda: all(store.records.best(tenant, c) is not None for c in convs),
                30,
                "a record for every job",
            )
            alive = [proc.poll() is None for proc, _ in workers]
        finally:
            for proc, _ in workers:
                proc.terminate()  # both at once: each warm shutdown takes a moment
            for proc, _ in workers:
                end(proc)
        logs = [log.read_text() for _, log in workers]
    assert alive == [True, True]
    assert all("RESOURCE_LOCKED" not in text and "ResourceLocked" not in text for text in logs)
    # the one INFO line per job (summary.computed is DEBUG): each worker wrote a record
    assert all(_wrote(text) for text in logs), "one worker did no job"
    names = {m.group(1) for text in logs for m in READY.finditer(text)}
    assert len(names) == 2, names
