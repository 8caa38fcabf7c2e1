"""Process supervision for `prefit up`: children live and die together, Redis is cleaned up."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time

import pytest
from pydantic import SecretStr

from shared import service
from shared.redisproc import find_redis_server, reachable
from shared.service import Supervisor, UpOptions, api_argv, describe_summarizer, worker_argv
from shared.settings import Settings

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
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
    assert argv[:6] == [sys.executable, "-m", "celery", "-A", "worker.app", "worker"]
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


def test_watch_returns_the_child_that_died() -> None:
    """watch() returns as soon as any child exits, naming it."""
    sup = Supervisor(poll_s=0.05)
    sup.spawn("sleeper", SLEEPER)
    quitter = sup.spawn("quitter", [sys.executable, "-c", "raise SystemExit(3)"])
    try:
        assert sup.watch() is quitter
        assert quitter.proc.returncode == 3
    finally:
        sup.stop()


def test_a_requested_stop_ends_watch_with_none() -> None:
    """request_stop (what the signal handlers call) makes watch() return None."""
    sup = Supervisor(poll_s=0.05)
    sup.spawn("sleeper", SLEEPER)
    sup.request_stop()
    try:
        assert sup.watch() is None
    finally:
        sup.stop()


def test_up_stops_everything_when_a_child_dies(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """If the API dies, `up` stops the worker and exits 1 naming the dead child."""
    pids: list[int] = []
    real_spawn = Supervisor.spawn

    def spawn(self: Supervisor, name: str, argv: list[str], env: dict[str, str]) -> service.Child:
        child = real_spawn(self, name, argv, env)
        pids.append(child.proc.pid)
        assert env["REDIS_URL"] == redis_url
        return child

    monkeypatch.setattr(Supervisor, "spawn", spawn)
    monkeypatch.setattr(service, "worker_argv", lambda settings: SLEEPER)
    monkeypatch.setattr(
        service, "api_argv", lambda *a: [sys.executable, "-c", "raise SystemExit(4)"]
    )
    out = io.StringIO()
    monkeypatch.setenv("REDIS_URL", redis_url)
    settings = Settings()
    code = service.run_up(UpOptions("127.0.0.1", 1, grace_s=2), settings, {}, out)
    assert code == 1
    assert "api exited with code 4" in out.getvalue()
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


@pytest.mark.skipif(find_redis_server() is None, reason="redis-server is not installed")
def test_up_starts_and_stops_an_embedded_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without REDIS_URL, `up` runs its own Redis, hands its URL to the children, then stops it."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("PREFIT_REDIS_URL", raising=False)
    seen: dict[str, bool] = {}

    def api(*_: object) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit(1)"]

    monkeypatch.setattr(service, "worker_argv", lambda settings: SLEEPER)
    monkeypatch.setattr(service, "api_argv", api)
    real_spawn = Supervisor.spawn

    def spawn(self: Supervisor, name: str, argv: list[str], env: dict[str, str]) -> service.Child:
        seen[name] = reachable(env["REDIS_URL"])
        return real_spawn(self, name, argv, env)

    monkeypatch.setattr(Supervisor, "spawn", spawn)
    out = io.StringIO()
    assert service.run_up(UpOptions("127.0.0.1", 1, grace_s=2), Settings(), {}, out) == 1
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
    assert service.run_up(UpOptions("127.0.0.1", 1), Settings(), {}, out) == 2
    assert spawned == []
    assert "does not answer" in out.getvalue() and "secret" not in out.getvalue()


def test_several_api_processes_get_a_metrics_directory_of_their_own() -> None:
    """One API process needs none; several get a new, empty directory, gone afterwards."""
    with service.metrics_dir(1) as none:
        assert none is None
    with service.metrics_dir(2) as first, service.metrics_dir(2) as second:
        assert first is not None and second is not None and first != second
        assert first.is_dir() and not any(first.iterdir())
        (first / "counter_1.db").write_bytes(b"x")
    assert not first.exists() and not second.exists()
