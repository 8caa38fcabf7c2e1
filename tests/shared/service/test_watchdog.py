"""The watchdog in real processes: a blocked event loop ends its process (exit 70) within
`stall_s` and an interval; a worker whose broker is gone and stays gone ends itself; while the
loops beat, the heartbeat file names the pid, a deadline ahead and the process's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shared.commands.redisproc import RedisProcess
from shared.service.watchdog import STALLED_EXIT, Watchdog, process_start
from tests.conftest import ROOT
from tests.redisbackend import needs_redis_server

BLOCKED_LOOP = """
import asyncio, sys, time
from pathlib import Path
from shared.logs import configure_logging
from shared.service.watchdog import Watchdog

configure_logging(json=True)
async def main():
    dog = Watchdog(float(sys.argv[1]), Path(sys.argv[2]))
    dog.watch("event_loop", asyncio.get_running_loop().call_soon_threadsafe)
    dog.start()
    await asyncio.sleep(2 * float(sys.argv[1]))  # beating: no exit while the loop runs
    print("blocking", time.time(), flush=True)
    time.sleep(60)  # the loop is stuck here
asyncio.run(main())
"""


def records(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_blocked_event_loop_ends_its_process(tmp_path: Path) -> None:
    """A loop that beats keeps its process; once it blocks, the process logs watchdog.stalled
    and exits 70 within stall_s plus an interval (0.5 s here)."""
    heartbeat = tmp_path / "alive"
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOOP, "1.0", str(heartbeat)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    ended = time.time()
    assert run.returncode == STALLED_EXIT, run.stderr
    blocked_at = float(run.stdout.split()[1])
    # judged from the last beat (up to an interval before the block): stall_s, give or take one
    assert 1.0 - 0.5 <= ended - blocked_at <= 1.0 + 0.5 + 1.0
    [stalled] = [r for r in records(run.stderr) if r["event"] == "watchdog.stalled"]
    assert stalled["loops"] == ["event_loop"] and stalled["level"] == "error"


def test_the_heartbeat_names_the_pid_and_a_deadline_ahead(tmp_path: Path) -> None:
    """While every loop beats, the file holds this pid and a deadline stall_s and an interval
    ahead; a loop that stops beating is judged stalled only past stall_s; resting (a warm
    shutdown) pushes the deadline past the rest; stop removes the file."""
    exits: list[int] = []
    heartbeat = tmp_path / "alive"
    dog = Watchdog(10.0, heartbeat, interval_s=1.0, exit=exits.append)
    dog.watch("consumer")
    now = time.monotonic()
    dog.check(now)
    pid, deadline, start = heartbeat.read_text().split()
    assert int(pid) == os.getpid() and start == process_start(os.getpid()) != "0"
    assert time.time() + 10.0 <= int(deadline) <= time.time() + 10.0 + 1.0 + 2
    assert dog.stalled(now + 9.9) == [] and dog.stalled(now + 10.1) == ["consumer"]
    dog.rest(60.0)
    assert dog.stalled(now + 30) == []
    assert int(heartbeat.read_text().split()[1]) >= time.time() + 59
    dog.check(now + 11)
    assert exits == []
    dog._resting_until = None  # the rest is over
    dog.check(now + 11)
    assert exits == [STALLED_EXIT]
    dog.stop()
    assert not heartbeat.exists()


@pytest.mark.slow
@needs_redis_server
def test_a_worker_whose_broker_is_gone_ends_itself(tmp_path: Path, redis_url: str) -> None:
    """A real worker (`prefit worker`) consuming from a broker of its own: the broker stopped
    for good, its consumer loop waits to reconnect and beats no more, and the worker exits 70
    within PREFIT_WATCHDOG_S and an interval, for its supervisor to start it again."""
    broker = RedisProcess().start()
    heartbeat = tmp_path / "alive"
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PREFIT_BROKER_URL": broker.url,
        "PREFIT_SUMMARY_QUEUE": f"watchdog-{uuid.uuid4().hex[:8]}",
        "PREFIT_HEARTBEAT_FILE": str(heartbeat),
        "PREFIT_WATCHDOG_S": "3",
        "PREFIT_LOG_JSON": "true",
    }
    argv = [sys.executable, "-m", "shared.commands.cli", "worker", "-n", "watchdog-test@%h"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not heartbeat.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        assert heartbeat.exists(), log.read_text()
        time.sleep(4)  # longer than PREFIT_WATCHDOG_S: beating, so still running
        assert proc.poll() is None, log.read_text()
        broker.stop()
        stopped = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
    assert code == STALLED_EXIT, log.read_text()
    assert took <= 3 + 0.5 + 2  # PREFIT_WATCHDOG_S, an interval, slack
    stalled = [r for r in records(log.read_text()) if r["event"] == "watchdog.stalled"]
    assert stalled and stalled[0]["loops"] == ["consumer"]
