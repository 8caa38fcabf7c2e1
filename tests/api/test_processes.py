"""Several API processes: each one's conversation cache stays right, `/metrics` sums them all.

Real processes (uvicorn, as `prefit up` starts them) on the suite's Redis: two on two ports,
so the test decides which process serves each request; then `prefit up --api-workers 2`,
two processes on one port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.commands.redisproc import free_port
from shared.commands.up import METRICS_DIR, api_argv
from tests.api.conftest import RESERVE, WINDOW, key_of
from tests.api.helpers import conv_id
from tests.builders import assistant, chat, user

# API processes of their own (uvicorn workers, `prefit up`): 6-12 s each
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
APPEND = "/v1/conversations/{conversation_id}/messages"
PREPARE = "/v1/conversations/{conversation_id}/prepare"
MODE = ("PREFIT_REDIS_CLUSTER", "PREFIT_BROKER_URL")


def environment(redis_url: str, tenant: str, model: str, **extra: str) -> dict[str, str]:
    """The API's environment: the suite's Redis, one tenant, one model, a queue of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFIT_", "PROMETHEUS_"))}
    # the suite's store mode (a Redis Cluster backend sets both) stays
    env.update({k: os.environ[k] for k in MODE if k in os.environ})
    window = {"max_input_tokens": WINDOW, "reserve_output": RESERVE}
    env.update(
        REDIS_URL=redis_url,
        PREFIT_API_KEYS=f"{tenant}:{key_of(tenant)}",
        PREFIT_MODELS=json.dumps({model: window}),
        PREFIT_SUMMARY_QUEUE=f"summaries-test-{tenant}",
        PREFIT_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


def wait_ready(url: str, proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the API exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{url} never answered")


@contextmanager
def api_process(env: dict[str, str]) -> Iterator[str]:
    """One API process (the command line `prefit up` runs), until the block ends."""
    port = free_port()
    proc = subprocess.Popen(
        api_argv("127.0.0.1", port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture
def two(redis_url: str, tenant: str, model: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two API processes on two ports, sharing Redis and a metrics directory."""
    env = environment(redis_url, tenant, model, **{METRICS_DIR: str(tmp_path)})
    with ExitStack() as stack:
        yield [stack.enter_context(api_process(env)) for _ in range(2)]


def client(url: str, tenant: str) -> httpx.Client:
    headers = {"authorization": f"Bearer {key_of(tenant)}"}
    return httpx.Client(base_url=url, headers=headers, timeout=10.0)


def test_each_process_prepares_what_the_other_just_wrote(
    two: list[str], tenant: str, model: str
) -> None:
    """Appends, a replace and prepares of one conversation, alternating between the two
    processes: every prepare answers the transcript as stored, whichever process cached it."""
    a, b = (client(url, tenant) for url in two)
    cid, expected = conv_id(), chat(2)
    path = f"/v1/conversations/{cid}"
    steps: list[tuple[httpx.Client, str, list[dict[str, Any]]]] = [
        (a, "append", expected),
        (b, "append", [user("from b")]),
        (a, "append", [assistant("from a")]),
        (b, "replace", [*chat(1), user("edited")]),
        (a, "append", [assistant("after the edit")]),
        (b, "append", [user("last")]),
    ]
    expected = []
    for writer, kind, messages in steps:
        body = {"messages": messages, "model": model}
        if kind == "append":
            r = writer.post(f"{path}/messages", json=body)
            expected = [*expected, *messages]
        else:
            r = writer.put(path, json=body)
            expected = list(messages)
        assert r.status_code == 200, r.text
        for reader in (a, b) if writer is b else (b, a):  # the other one first
            got = reader.post(f"{path}/prepare", json={"model": model})
            assert got.status_code == 200, got.text
            assert got.json()["messages"] == expected


def counted(text: str, name: str, **labels: str) -> float:
    """The value of one series of a Prometheus exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") or series == name:
            got = ",".join(sorted(series[len(name) + 1 : -1].split(","))) if "{" in series else ""
            if got == want:
                return float(value)
    return 0.0


def settled_metrics(scraper: httpx.Client, route: str, expected: int) -> str:
    """`/metrics` once `route` has been counted `expected` times, or after 5 s: a request is
    counted by the request log after its answer is sent, so the client can be a step ahead."""
    deadline = time.monotonic() + 5
    while True:
        text = scraper.get("/metrics").text
        done = counted(text, "prefit_http_requests_total", route=route, status="200")
        if done >= expected or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_metrics_are_summed_over_the_processes(two: list[str], tenant: str, model: str) -> None:
    """Requests served by either process are counted once on `/metrics`, whichever process
    answers the scrape; what is read from Redis at scrape time appears once."""
    a, b = (client(url, tenant) for url in two)
    cid = conv_id()
    for i in range(3):
        body = {"messages": [user(f"turn {i}")], "model": model}
        assert a.post(f"/v1/conversations/{cid}/messages", json=body).status_code == 200
    for _ in range(5):
        assert b.post(f"/v1/conversations/{cid}/prepare", json={"model": model}).status_code == 200
    for scraper in (a, b):
        text = settled_metrics(scraper, PREPARE, 5)
        assert counted(text, "prefit_http_requests_total", route=APPEND, status="200") == 3
        assert counted(text, "prefit_http_requests_total", route=PREPARE, status="200") == 5
        assert counted(text, "prefit_prepare_seconds_count", kind="stored") == 5
        assert counted(text, "prefit_store_up") == 1
        assert len(re.findall(r"^prefit_store_up ", text, re.MULTILINE)) == 1
        assert len(re.findall(r"^prefit_summaries_made_total ", text, re.MULTILINE)) == 1


def test_prefit_up_runs_the_api_processes_on_one_port(
    redis_url: str, tenant: str, model: str
) -> None:
    """`prefit up --api-workers 2`: two API processes answer one port, each keeping its
    metrics in a directory of the run's own, summed on `/metrics`, removed at the end."""
    port = free_port()
    env = environment(redis_url, tenant, model, PREFIT_WORKER_CONCURRENCY="2")
    argv = [
        sys.executable,
        "-m",
        "shared.commands.cli",
        "up",
        "--api-workers",
        "2",
        "--port",
        str(port),
    ]
    up = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert up.stdout is not None
        directory = None
        for line in up.stdout:  # the banner names the directory before the API is ready
            found = re.search(r"API processes' files in ([^\s\"]+)", line)
            if found:
                directory = Path(found.group(1))
                break
        assert directory is not None
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, up, timeout_s=60)
        deadline = time.monotonic() + 30
        while len(_pids(directory)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_pids(directory)) == 2, sorted(directory.iterdir())
        cid = conv_id()
        for i in range(20):  # a new connection each: either process may take it
            with client(url, tenant) as c:
                body = {"messages": [user(f"turn {i}")], "model": model}
                assert c.post(f"/v1/conversations/{cid}/messages", json=body).status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert counted(text, "prefit_http_requests_total", route=APPEND, status="200") == 20
        up.send_signal(signal.SIGINT)
        up.wait(60)
    finally:
        if up.poll() is None:
            up.kill()
        up.communicate()
    assert up.returncode == 0
    assert not directory.exists()


def _pids(directory: Path) -> set[str]:
    """The processes that keep metrics files in `directory` (files are `<kind>_<pid>.db`)."""
    return {m.group(1) for p in directory.glob("*.db") if (m := re.search(r"_(\d+)\.db$", p.name))}
