"""`prefit up`'s output: one JSON line per request and per summary job, a few for start and
stop, every line structured, Celery's own per-task lines gone, no message content."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from shared.commands.demo import generate_conversation
from shared.commands.redisproc import free_port
from shared.messages import Message, groups
from tests.conftest import ROOT
from tests.redisbackend import needs_redis_server

MARKER = "QUOKKAWORD"  # in every message: no log line may carry it
KEY = "logs-key"
STARTUP_AND_STOP_LINES = 30  # child starts, the banner, uvicorn's and Celery's few, the stops


def start_up(port: int, **env: str) -> subprocess.Popen[str]:
    """`prefit up` on `port` with a Redis of its own, as a person runs it (log settings left
    to their defaults), `env` added; its stdout and stderr on one pipe."""
    dropped = ("REDIS_URL", "PREFIT_REDIS_URL", "PREFIT_LOG_JSON", "PREFIT_LOG_LEVEL")
    environment = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.Popen(
        [sys.executable, "-m", "shared.commands.cli", "up", "--port", str(port), "--grace", "10"],
        env={**environment, **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def conversation() -> list[Message]:
    """The demo's agent session, long enough for summaries at 16k, each text marked."""
    messages, _ = generate_conversation(30)
    for m in messages:
        if isinstance(m.get("content"), str):
            m["content"] = f"{MARKER} {m['content']}"
    return messages


class Output:
    """The lines a process writes, read as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines) if line.strip()]

    def join(self) -> None:
        self._reader.join(timeout=10)


def wait_for(what: str, check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def send_traffic(url: str, messages: list[Message]) -> int:
    """Replace, then append and prepare turn by turn, as a client does; the request count."""
    spans = groups(messages)
    headers = {"Authorization": f"Bearer {KEY}"}
    sent = 0
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        first = {"messages": messages[: spans[0][1]], "model": "gpt-4o"}
        client.put("/v1/conversations/c1", json=first).raise_for_status()
        sent += 1
        for a, b in spans[1:]:
            body = {"messages": messages[a:b], "model": "gpt-4o", "expected_length": a}
            client.post("/v1/conversations/c1/messages", json=body).raise_for_status()
            client.post("/v1/conversations/c1/prepare", json={"model": "gpt-4o"}).raise_for_status()
            sent += 2
    return sent


def enqueued(records: list[dict[str, Any]]) -> int:
    return sum(1 for r in records if r["event"] == "request.completed" and "enqueued" in r)


def finished(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "summary.task_finished"]


@pytest.mark.slow
@needs_redis_server
def test_up_writes_one_structured_line_per_request_and_per_summary_job() -> None:
    """Every line `prefit up` prints (not a terminal) is JSON with event, level and timestamp;
    one `request.completed` per request, one `summary.task_finished` per job enqueued, no
    line of Celery's per task, and not a word of the conversation anywhere."""
    port = free_port()
    up = start_up(
        port,
        PREFIT_API_KEYS=f"t:{KEY}",
        PREFIT_MODELS='{"gpt-4o": {"max_input_tokens": 16000}}',
        PREFIT_WORKER_CONCURRENCY="4",
    )
    out = Output(up)
    try:
        wait_for("the ready line", lambda: any('"service.ready"' in x for x in out.lines))
        wait_for("Celery's worker", lambda: any("celery.apps.worker" in x for x in out.lines))
        sent = send_traffic(f"http://127.0.0.1:{port}", conversation())
        wait_for("every request's line", lambda: _requests(out.records()) >= sent, 30)
        wait_for(
            "a line per job",
            lambda: len(finished(out.records())) >= enqueued(out.records()) > 0,
        )
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        out.join()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, "\n".join(out.lines[-20:])
    records = out.records()  # every line is JSON, or this raises
    assert all({"event", "level", "timestamp"} <= r.keys() for r in records)
    assert _requests(records) == sent
    jobs = finished(records)
    assert len(jobs) == enqueued(records) >= 1
    assert len({j["task_id"] for j in jobs}) == len(jobs)
    assert any(j["status"] == "written" for j in jobs)
    loggers = Counter(r.get("logger") for r in records)
    assert not loggers["celery.app.trace"] and not loggers["celery.worker.strategy"]
    assert not any("succeeded in" in r["event"] or "received" in r["event"] for r in records)
    assert MARKER not in "\n".join(out.lines)
    health = sum(1 for r in records if r.get("route") == "/healthz")
    assert len(records) <= sent + health + len(jobs) + STARTUP_AND_STOP_LINES, Counter(
        r["event"] for r in records
    )


def _requests(records: list[dict[str, Any]]) -> int:
    """The request lines of the test's own requests (up polls /healthz while starting)."""
    return sum(
        1 for r in records if r["event"] == "request.completed" and r.get("route") != "/healthz"
    )
