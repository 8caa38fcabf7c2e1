"""`prefit up`'s supervision: dead children come back with backoff, Redis is cleaned up."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from shared.commands import up as service
from shared.commands.redisproc import free_port, reachable
from shared.commands.up import (
    Backoff,
    Supervisor,
    UpOptions,
    api_argv,
    describe_summarizer,
    worker_argv,
)
from shared.logs import UVICORN_LOG_CONFIG
from shared.settings import Settings
from tests.conftest import ROOT
from tests.redisbackend import needs_redis_server

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
QUITTER = [sys.executable, "-c", "raise SystemExit(3)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); "
    "time.sleep(60)",
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_command_lines_follow_the_settings() -> None:
    """The worker and API command lines carry the queue, pool, concurrency, host and port."""
    settings = Settings(worker_concurrency=33, summary_queue="q1", log_level="debug")
    argv = worker_argv(settings)
    assert argv[:7] == [sys.executable, "-m", "celery", "--quiet", "-A", "worker.app", "worker"]
    assert argv[argv.index("-Q") + 1] == "q1"
    assert argv[argv.index("-P") + 1] == "threads"
    assert argv[argv.index("-c") + 1] == "33"
    assert {"--without-gossip", "--without-mingle"} <= set(argv)
    assert worker_argv(settings, 4)[argv.index("-c") + 1] == "4"
    assert api_argv("0.0.0.0", 9001) == [
        sys.executable,
        "-m",
        "uvicorn",
        "api.app:app",
        "--host",
        "0.0.0.0",
        "--port",
        "9001",
        "--no-access-log",
        "--log-config",
        str(UVICORN_LOG_CONFIG),
        "--http",
        "api.connections:GuardedHttpTools",
    ]
    assert api_argv("h", 1, 3)[-2:] == ["--workers", "3"]


def test_summarizer_description_never_shows_credentials() -> None:
    """Extractive without a URL; a configured URL is shown without user, password or query."""
    assert describe_summarizer(Settings(summarizer_url=None)).startswith("extractive")
    text = describe_summarizer(
        Settings(
            summarizer_url="https://user:pw@llm.example:8443/v1?key=s3cret",
            summarizer_model="m1",
            summarizer_api_key=SecretStr("sk-secret"),
        )
    )
    assert "https://llm.example:8443/v1" in text and "m1" in text
    assert not re.search("pw|s3cret|sk-secret|user", text)


def test_stop_terminates_children_and_kills_the_stubborn() -> None:
    """SIGTERM first; a child ignoring it is SIGKILLed after the grace period."""
    sup = Supervisor(grace_s=0.5)
    polite = sup.spawn("polite", SLEEPER)
    stubborn = sup.spawn("stubborn", STUBBORN)
    time.sleep(0.3)  # let the stubborn child install its handler
    sup.stop()
    assert polite.proc.returncode == -signal.SIGTERM
    assert stubborn.proc.returncode == -signal.SIGKILL
    assert not _alive(polite.proc.pid) and not _alive(stubborn.proc.pid)


def test_a_dead_child_is_restarted_after_a_growing_wait() -> None:
    """A child that keeps dying comes back after 1 s, 2 s, 4 s, capped; the others run on."""
    sup = Supervisor(backoff=Backoff(first_s=1.0, max_s=4.0, stable_s=60.0))
    sleeper = sup.spawn("sleeper", SLEEPER)
    quitter = sup.spawn("quitter", QUITTER)
    waits: list[float] = []
    try:
        for _ in range(4):
            quitter.proc.wait()
            now = time.monotonic()
            sup.tend(now)  # notes the death
            assert quitter.restart_at is not None
            waits.append(quitter.restart_at - now)
            dead = quitter.proc
            sup.tend(quitter.restart_at - 0.01)
            assert quitter.proc is dead  # not before its wait is over
            sup.tend(quitter.restart_at)
            assert quitter.proc is not dead and quitter.restart_at is None
        # restart_at - now loses bits at a large monotonic clock: equal within a microsecond
        assert waits == pytest.approx([1.0, 2.0, 4.0, 4.0], abs=1e-6)
        assert quitter.restarts == 4 and sleeper.restarts == 0 and sleeper.proc.poll() is None
    finally:
        sup.stop()


def test_the_wait_starts_over_once_a_child_stayed_up() -> None:
    """A child that ran `stable_s` seconds before dying waits `first_s` again, not longer."""
    sup = Supervisor(backoff=Backoff(first_s=1.0, max_s=30.0, stable_s=5.0))
    child = sup.spawn("sleeper", SLEEPER)
    try:
        child.deaths = 3  # it had been dying before this run
        sup.tend(child.started_at + 5.0)
        assert child.deaths == 0
        child.proc.kill()
        child.proc.wait()
        now = child.started_at + 6.0
        sup.tend(now)
        assert child.restart_at == now + 1.0
    finally:
        sup.stop()


def test_a_requested_stop_ends_watch() -> None:
    """request_stop (what the signal handlers call) makes watch() return."""
    sup = Supervisor(poll_s=0.05)
    sup.spawn("sleeper", SLEEPER)
    sup.request_stop()
    try:
        sup.watch()
        assert sup.stopping
    finally:
        sup.stop()


@pytest.mark.slow
def test_up_restarts_a_dead_child_until_told_to_stop(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """A crashing API is restarted with backoff while the worker runs on; SIGTERM ends `up` (0)."""
    spawned: list[str] = []
    real_spawn = Supervisor.spawn

    def spawn(self: Supervisor, name: str, argv: list[str], env: dict[str, str]) -> service.Child:
        spawned.append(name)
        assert env["REDIS_URL"] == redis_url
        return real_spawn(self, name, argv, env)

    monkeypatch.setattr(Supervisor, "spawn", spawn)
    monkeypatch.setattr(service, "worker_argv", lambda settings: SLEEPER)
    monkeypatch.setattr(service, "api_argv", lambda *a: QUITTER)
    monkeypatch.setenv("REDIS_URL", redis_url)
    out = io.StringIO()
    children: list[service.Child] = []
    real_tend = Supervisor.tend

    def tend(self: Supervisor, now: float) -> None:
        children[:] = self.children
        real_tend(self, now)
        if self.children[1].restarts >= 2:  # the API came back twice: enough
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Supervisor, "tend", tend)
    fast = Backoff(first_s=0.05, max_s=0.2, stable_s=60.0)
    code = service.run_up(
        UpOptions("127.0.0.1", free_port(), grace_s=2, backoff=fast), Settings(), {}, out
    )
    assert code == 0
    assert spawned == ["worker", "api"]
    assert out.getvalue().count("api exited with code 3; restarting in") >= 2
    worker, api = children
    assert worker.restarts == 0 and api.restarts >= 2
    assert not any(_alive(c.proc.pid) for c in children)


def test_up_starts_as_many_summary_workers_as_asked_each_with_its_own_name(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """`--workers 3`: three worker children beside the API, each with a node name of its own."""
    spawned: list[tuple[str, list[str]]] = []
    real_spawn = Supervisor.spawn

    def spawn(self: Supervisor, name: str, argv: list[str], env: dict[str, str]) -> service.Child:
        spawned.append((name, argv))
        if name == "api":
            os.kill(os.getpid(), signal.SIGTERM)  # everything is started: stop
        return real_spawn(self, name, SLEEPER, env)

    monkeypatch.setattr(Supervisor, "spawn", spawn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    opts = UpOptions("127.0.0.1", free_port(), grace_s=2, summary_workers=3)
    assert service.run_up(opts, Settings(), {}, io.StringIO()) == 0
    assert [name for name, _ in spawned] == ["worker-1", "worker-2", "worker-3", "api"]
    names = {argv[argv.index("-n") + 1] for name, argv in spawned if name != "api"}
    assert len(names) == 3 and all(n.startswith("prefit-") for n in names)


@needs_redis_server
def test_up_starts_and_stops_an_embedded_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without REDIS_URL, `up` runs its own Redis, hands its URL to the children, then stops it."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("PREFIT_REDIS_URL", raising=False)
    seen: dict[str, bool] = {}

    def api(*_: object) -> list[str]:
        return SLEEPER

    monkeypatch.setattr(service, "worker_argv", lambda settings: SLEEPER)
    monkeypatch.setattr(service, "api_argv", api)
    real_spawn = Supervisor.spawn

    def spawn(self: Supervisor, name: str, argv: list[str], env: dict[str, str]) -> service.Child:
        seen[name] = reachable(env["REDIS_URL"])
        child = real_spawn(self, name, argv, env)
        if name == "api":
            self.request_stop()  # as Ctrl-C would, once both children run
        return child

    monkeypatch.setattr(Supervisor, "spawn", spawn)
    out = io.StringIO()
    assert service.run_up(UpOptions("127.0.0.1", free_port(), grace_s=2), Settings(), {}, out) == 0
    url = re.search(r"redis (redis://\S+) \(embedded", out.getvalue())
    assert url is not None, out.getvalue()
    assert seen == {"worker": True, "api": True}
    assert not reachable(url.group(1))


def test_up_refuses_an_unreachable_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """A REDIS_URL that does not answer is reported (exit 2) before any child starts."""
    spawned: list[str] = []
    monkeypatch.setattr(Supervisor, "spawn", lambda self, name, *a: spawned.append(name))
    monkeypatch.setenv("REDIS_URL", "redis://:secret@127.0.0.1:1/0")
    out = io.StringIO()
    assert service.run_up(UpOptions("127.0.0.1", free_port()), Settings(), {}, out) == 2
    assert spawned == []
    assert "does not answer" in out.getvalue() and "secret" not in out.getvalue()


@pytest.mark.slow
@needs_redis_server
def test_prefit_up_keeps_serving_while_its_killed_worker_comes_back(tmp_path: Path) -> None:
    """SIGKILL of `up`'s worker: the API answers throughout, a new worker starts; SIGTERM stops."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PREFIT_REDIS_URL")}
    env.update(PREFIT_LOG_JSON="true", PREFIT_WORKER_CONCURRENCY="4", PREFIT_API_KEYS="")
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shared.commands.cli",
                "up",
                "--port",
                str(port),
                "--grace",
                "5",
            ],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        _wait_for(lambda: "ready at" in out.read_text(), 60, "prefit up to be ready")
        worker = _started_pid(err, "worker")
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2.0)
        os.kill(worker, signal.SIGKILL)
        answers: list[int] = []
        deadline = time.monotonic() + 30
        while "worker restarted" not in out.read_text() and time.monotonic() < deadline:
            answers.append(api.get("/healthz").status_code)
            time.sleep(0.05)
        restarted = re.search(r"worker restarted \(pid (\d+)\)", out.read_text())
        assert restarted is not None, out.read_text()
        assert _alive(int(restarted.group(1))) and int(restarted.group(1)) != worker
        assert answers and set(answers) == {200}  # the API never stopped answering
        api.close()
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert "worker exited with code -9; restarting in 1s" in out.read_text()


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _started_pid(log: Path, child: str) -> int:
    for line in log.read_text().splitlines():
        if '"service.child_started"' in line and f'"child": "{child}"' in line:
            return int(json.loads(line)["pid"])
    raise AssertionError(f"no {child} start in the log")


def test_several_api_processes_get_a_metrics_directory_of_their_own() -> None:
    """One API process needs none; several get a new, empty directory, gone afterwards."""
    with service.metrics_dir(1) as none:
        assert none is None
    with service.metrics_dir(2) as first, service.metrics_dir(2) as second:
        assert first is not None and second is not None and first != second
        assert first.is_dir() and not any(first.iterdir())
        (first / "counter_1.db").write_bytes(b"x")
    assert not first.exists() and not second.exists()


def _spawn_and_stop(spawned: list[str]) -> Callable[..., None]:
    """A `Supervisor.spawn` that records the name and asks `up` to stop (so it never hangs)."""

    def spawn(self: Supervisor, name: str, *_: object) -> None:
        spawned.append(name)
        self.request_stop()

    return spawn


def test_up_refuses_a_port_another_server_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A taken port is reported (exit 2) before any child starts: uvicorn would otherwise be
    restarted forever while the other server answered `up`'s readiness check."""
    spawned: list[str] = []
    monkeypatch.setattr(Supervisor, "spawn", _spawn_and_stop(spawned))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = io.StringIO()
        assert service.run_up(UpOptions("127.0.0.1", port), Settings(), {}, out) == 2
    assert spawned == []
    assert f"cannot listen on 127.0.0.1:{port}" in out.getvalue(), out.getvalue()


@pytest.mark.parametrize("port", [0, -1, 70000])
def test_up_refuses_a_port_that_is_not_one(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Port 0, negative or over 65535 is named before any child starts."""
    spawned: list[str] = []
    monkeypatch.setattr(Supervisor, "spawn", _spawn_and_stop(spawned))
    out = io.StringIO()
    assert service.run_up(UpOptions("127.0.0.1", port), Settings(), {}, out) == 2
    assert spawned == [] and f"port {port} is not a TCP port" in out.getvalue()


def test_up_names_a_redis_dir_it_cannot_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--redis-dir naming a file is a one-line error (exit 2), not a traceback."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("PREFIT_REDIS_URL", raising=False)
    monkeypatch.setattr(Supervisor, "spawn", _spawn_and_stop([]))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    opts = UpOptions("127.0.0.1", free_port(), redis_dir=blocker)
    out = io.StringIO()
    assert service.run_up(opts, Settings(), {}, out) == 2
    assert f"--redis-dir {blocker}: cannot make the folder" in out.getvalue()


@pytest.mark.slow
def test_up_stops_when_the_api_never_starts(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """An API that exits again and again before it ever answers (a configuration it refuses)
    ends `up` with exit 2 and says so, instead of restarting it forever."""
    monkeypatch.setattr(service, "worker_argv", lambda settings: SLEEPER)
    monkeypatch.setattr(service, "api_argv", lambda *a: QUITTER)
    monkeypatch.setenv("REDIS_URL", redis_url)
    fast = Backoff(first_s=0.05, max_s=0.2, stable_s=60.0)
    out = io.StringIO()
    opts = UpOptions("127.0.0.1", free_port(), grace_s=2, backoff=fast)
    assert service.run_up(opts, Settings(), {}, out) == 2
    assert "the API exited 3 times before it answered (last exit code 3)" in out.getvalue()


@pytest.mark.parametrize("url", ["", "http://h:1", "redis://127.0.0.1:99999"])
def test_up_names_a_redis_url_that_is_not_one(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A REDIS_URL redis-py cannot parse is a one-line error (exit 2), not a traceback."""
    spawned: list[str] = []
    monkeypatch.setattr(Supervisor, "spawn", _spawn_and_stop(spawned))
    monkeypatch.setenv("REDIS_URL", url)
    out = io.StringIO()
    assert service.run_up(UpOptions("127.0.0.1", free_port()), Settings(), {}, out) == 2
    assert spawned == [] and "is not a Redis URL" in out.getvalue(), out.getvalue()
