"""The `prefit` console script: argument wiring, `worker`, `inspect`, `demo`, `up` end to end."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from shared.client import PrefitClient
from shared.commands import cli
from shared.commands.demo import DemoOptions, generate_conversation, load_conversation, replay
from shared.commands.redisproc import free_port, reachable
from shared.errors import InvalidTranscript
from shared.messages import groups, validate
from shared.settings import Settings, get_settings
from tests.conftest import ROOT, needs_transcripts, transcript_files
from tests.redisbackend import needs_redis_server
from tests.shared.commands.test_up_logs import start_up


class FakeService:
    """Just enough of the API for the demo: a store, expected_length checks, summaries landing."""

    def __init__(self, *, does_not_fit_at: int | None = None, window: int = 128_000) -> None:
        self.window = window  # the window the service's reports say is in force
        self.convs: dict[str, list[Any]] = {}
        self.calls: list[tuple[str, str, dict[str, Any], str | None]] = []
        self.prepares = 0
        self.does_not_fit_at = does_not_fit_at

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        path = request.url.path
        self.calls.append((request.method, path, body, request.headers.get("Authorization")))
        conv = path.split("/")[3]
        stored = self.convs.setdefault(conv, [])
        if request.method == "PUT":
            stored[:] = body["messages"]
        elif path.endswith("/messages"):
            if body.get("expected_length", len(stored)) != len(stored):
                error = {"type": "LengthMismatch", "message": "no", "expected": 0, "actual": 1}
                return httpx.Response(409, json={"error": error})
            stored.extend(body["messages"])
        else:
            return self._prepare(stored)
        state = {"conversation_id": conv, "length": len(stored), "tokens": 10 * len(stored)}
        return httpx.Response(200, json={**state, "state": "under"})

    def _prepare(self, stored: list[Any]) -> httpx.Response:
        self.prepares += 1
        if self.prepares == self.does_not_fit_at:
            error = {"type": "DoesNotFit", "message": "too big", "tokens": 9, "budget": 1}
            return httpx.Response(400, json={"error": error})
        upto = None if self.prepares < 3 else 5 if self.prepares < 6 else 9
        report = {"summary": None if upto is None else {"upto": upto}, "stale": self.prepares == 2}
        report["window"] = self.window
        return httpx.Response(200, json={"messages": [], "tokens": 100, "report": report})


def _client(fake: FakeService, key: str | None = None) -> PrefitClient:
    return PrefitClient("http://prefit.test", key, transport=httpx.MockTransport(fake), retries=0)


def test_subcommands_parse_their_options() -> None:
    """up, worker and demo parse their flags; demo needs exactly one source."""
    parser = cli.build_parser()
    up = parser.parse_args(["up", "--port", "9000", "--api-workers", "2", "--redis-dir", "/tmp/r"])
    assert (up.port, up.api_workers, up.host, up.redis_dir) == (9000, 2, None, Path("/tmp/r"))
    assert parser.parse_args(["worker", "--concurrency", "8"]).concurrency == 8
    demo = parser.parse_args(["demo", "--generate", "--window", "5000"])
    assert (demo.generate, demo.file, demo.window, demo.url) == (True, None, 5000, None)
    for bad in (["demo"], ["demo", "f.json", "--generate"], ["worker", "--concurrency", "0"], []):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(bad)
        assert exit_.value.code == 2


def test_a_count_that_is_not_a_number_is_named_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    """`--window abc` says a positive integer is wanted, not "invalid _positive value"."""
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["demo", "--generate", "--window", "abc"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "argument --window: must be a positive integer, got 'abc'" in err, err


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("PREFIT_MODELS", "{bad", 'error parsing value for field "models"'),
        (
            "PREFIT_MODELS",
            '{"m": {"max_input_tokens": -5}}',
            "models.m.max_input_tokens (PREFIT_MODELS): Input should be greater than 0",
        ),
        ("PREFIT_PORT", "abc", "port (PREFIT_PORT): Input should be a valid integer"),
    ],
)
def test_a_malformed_setting_is_one_line_not_a_traceback(
    name: str,
    value: str,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every command reads the settings first: a bad one exits 2 naming it."""
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "get_settings", Settings)  # read now, not the process's cached
    monkeypatch.setattr(cli, "run_up", lambda *a: pytest.fail("up started"))
    assert cli.main(["up"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefit: invalid settings: ") and said in err, err


def test_up_sets_api_processes_and_summary_workers_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--api-workers N` sets the API processes, `--workers N` the summary worker processes."""
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(
        cli, "run_up", lambda opts, *a: started.append((opts.workers, opts.summary_workers)) or 0
    )
    for argv in (["up"], ["up", "--api-workers", "3"], ["up", "--workers", "2"]):
        assert cli._up(cli.build_parser().parse_args(argv), Settings(api_keys="t:k")) == 0
    assert started == [(1, 1), (3, 1), (1, 2)]


def test_worker_execs_celery_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefit worker` replaces itself with the Celery worker command line."""
    execed: list[list[str]] = []
    monkeypatch.setattr(cli, "_exec", execed.append)
    cli.main(["worker", "--concurrency", "7"])
    (argv,) = execed
    assert argv[1:7] == ["-m", "celery", "--quiet", "-A", "worker.app", "worker"]
    assert argv[argv.index("-c") + 1] == "7" and argv[argv.index("-P") + 1] == "threads"


def test_api_execs_uvicorn_with_the_structured_log_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefit api` replaces itself with uvicorn on the given (else the settings') address, its
    own start lines through prefit's log config, no access log (request.completed is ours)."""
    execed: list[list[str]] = []
    monkeypatch.setattr(cli, "_exec", execed.append)
    cli.main(["api", "--host", "0.0.0.0", "--port", "8123"])
    cli.main(["api", "--port", "9000"])
    first, second = execed
    assert first[1:4] == ["-m", "uvicorn", "api.app:app"]
    assert first[first.index("--host") + 1 :][:3] == ["0.0.0.0", "--port", "8123"]
    host = get_settings().host
    assert second[second.index("--host") + 1 :][:3] == [host, "--port", "9000"]
    config = Path(first[first.index("--log-config") + 1])
    assert config.is_file() and "shared.logs.uvicorn_formatter" in config.read_text()
    assert "--no-access-log" in first


def test_worker_takes_a_node_name_or_makes_a_unique_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefit worker -n NAME` passes the Celery node name; without it every worker gets its
    own `prefit-<random>@%h`, so two on one host never share a pidbox queue."""
    execed: list[list[str]] = []
    monkeypatch.setattr(cli, "_exec", execed.append)
    cli.main(["worker", "-n", "extra@%h"])
    cli.main(["worker", "--name", "other@box"])
    cli.main(["worker"])
    cli.main(["worker"])
    names = [argv[argv.index("-n") + 1] for argv in execed]
    assert names[:2] == ["extra@%h", "other@box"]
    assert all(n.startswith("prefit-") and n.endswith("@%h") for n in names[2:])
    assert names[2] != names[3]


def test_inspect_is_handed_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefit inspect ...` calls `inspect_command` with the rest of the command line."""
    got: list[list[str]] = []

    def fake_command(argv: list[str]) -> int:
        got.append(argv)
        return 5

    monkeypatch.setitem(
        sys.modules, "shared.commands.inspect", SimpleNamespace(inspect_command=fake_command)
    )
    assert cli.main(["inspect", "t.json", "--window", "9"]) == 5
    assert got == [["t.json", "--window", "9"]]


def test_first_api_key_is_the_local_default() -> None:
    """The demo's default key is the first `tenant:key` pair of PREFIT_API_KEYS."""
    assert cli._first_key("t1:k1, t2:k2") == "k1"
    assert cli._first_key("") is None


def test_replay_appends_turn_by_turn_and_highlights_landings() -> None:
    """One line per turn group; expected_length tracks the length; new summaries are marked."""
    messages, tools = generate_conversation(turns=6)
    fake = FakeService()
    out = io.StringIO()
    with _client(fake) as client:
        opts = DemoOptions(conversation_id="c1", window=16000)
        assert replay(client, messages, tools, opts, out) == 0
    spans = groups(messages)
    writes = [(m, b) for m, p, b, _ in fake.calls if m == "PUT" or p.endswith("/messages")]
    assert writes[0][0] == "PUT"
    assert [b["expected_length"] for _, b in writes[1:]] == [i for i, _ in spans[1:]]
    assert all(b["max_input_tokens"] == 16000 and b["tools"] == tools for _, b in writes)
    assert fake.convs["c1"] == messages
    lines = out.getvalue().splitlines()
    assert len(lines) == len(spans) + 3  # header, legend, one per turn, footer
    assert sum("summary landed" in line for line in lines) == 2
    assert "stale" in lines[3] and "no summary" in lines[2]
    assert "2 summaries landed" in lines[-1]


def test_replay_reports_the_window_the_service_fits_to() -> None:
    """Without --window the demo sends none (the service's PREFIT_MODELS decides) and its
    header and bars show the window the service's report says is in force."""
    messages, tools = generate_conversation(turns=2)
    fake = FakeService(window=128_000)
    out = io.StringIO()
    with _client(fake) as client:
        assert replay(client, messages, tools, DemoOptions(), out) == 0
    assert all("max_input_tokens" not in body for _, _, body, _ in fake.calls)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("model gpt-4o, window 128,000 tokens"), lines[0]
    assert "/128,000 of" in lines[2]


def test_replay_reports_a_turn_that_does_not_fit_and_goes_on() -> None:
    """A DoesNotFit prepare prints a line for that turn and the replay continues."""
    messages, tools = generate_conversation(turns=3)
    fake = FakeService(does_not_fit_at=2)
    out = io.StringIO()
    with _client(fake) as client:
        replay(client, messages, tools, DemoOptions(), out)
    lines = out.getvalue().splitlines()
    assert "does not fit" in lines[3]
    assert len(lines) == len(groups(messages)) + 3


def test_demo_command_uses_the_given_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefit demo --generate` replays through a client built from --url and --api-key."""
    fake = FakeService()
    made: list[str] = []

    def factory(url: str, key: str | None) -> PrefitClient:
        made.append(url)
        return PrefitClient(url, key, transport=httpx.MockTransport(fake))

    monkeypatch.setattr(cli, "PrefitClient", factory)
    argv = ["demo", "--generate", "--turns", "2", "--url", "http://x:1", "--api-key", "k9"]
    assert cli.main(argv) == 0
    assert made == ["http://x:1"]
    assert {auth for *_, auth in fake.calls} == {"Bearer k9"}


def test_demo_command_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing file exits 2; a service error exits 1 with the error's type, no traceback."""
    assert cli.main(["demo", str(tmp_path / "missing.json")]) == 2
    monkeypatch.setattr(cli, "PrefitClient", lambda url, key: _client(FakeService(), key))
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    )
    monkeypatch.setattr(cli, "replay", _raise_length_mismatch)
    assert cli.main(["demo", str(path)]) == 1


def _raise_length_mismatch(*_: Any) -> int:
    from shared.errors import LengthMismatch

    raise LengthMismatch(1, 2)


def test_conversation_files_load_in_both_shapes(tmp_path: Path) -> None:
    """A bare list or {messages, tools}; anything else is an InvalidTranscript."""
    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    (tmp_path / "a.json").write_text(json.dumps(msgs))
    (tmp_path / "b.json").write_text(json.dumps({"messages": msgs, "tools": tools}))
    (tmp_path / "c.json").write_text(json.dumps({"turns": []}))
    assert load_conversation(tmp_path / "a.json") == (msgs, [])
    assert load_conversation(tmp_path / "b.json") == (msgs, tools)
    with pytest.raises(InvalidTranscript):
        load_conversation(tmp_path / "c.json")


@needs_transcripts
def test_real_transcript_files_load() -> None:
    """The real transcripts beside the repository are valid demo input."""
    messages, _ = load_conversation(transcript_files()[0])
    assert messages


def test_generated_conversation_is_deterministic_and_valid() -> None:
    """Same seed, same conversation; it is a valid transcript long enough to need summaries."""
    first, tools = generate_conversation()
    assert generate_conversation() == (first, tools)
    assert generate_conversation(seed=8)[0] != first
    assert validate(first) == first
    assert sum(len(json.dumps(m)) for m in first) > 4 * 16000  # > the default window


# --- `prefit up` end to end ----------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@needs_redis_server
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find child processes")
@pytest.mark.skipif(
    not (ROOT / "api" / "app.py").is_file() or not (ROOT / "worker" / "app.py").is_file(),
    reason="api/app.py or worker/app.py does not exist yet",
)
def test_prefit_up_serves_a_demo_and_shuts_down_cleanly() -> None:
    """`prefit up` answers /healthz, serves `prefit demo --generate`, and on SIGINT exits 0
    leaving no child process and no Redis behind."""
    port = free_port()
    env = {"PREFIT_API_KEYS": "demo:demo-key", "PREFIT_WORKER_CONCURRENCY": "4"}
    env.update(PREFIT_MODELS='{"gpt-4o": {"max_input_tokens": 16000}}')
    up = start_up(port, **env)
    try:
        _wait_healthy(up, f"http://127.0.0.1:{port}/healthz")
        children = _descendants(up.pid)
        assert len(children) >= 3  # redis-server, the worker, the API
        demo = subprocess.run(
            [
                sys.executable,
                "-m",
                "shared.commands.cli",
                "demo",
                "--generate",
                "--turns",
                "30",
                "--wait-ms",
                "5000",
                "--url",
                f"http://127.0.0.1:{port}",
                "--api-key",
                "demo-key",
                "--no-color",
            ],
            env={**os.environ, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "turns appended" in demo.stdout
        assert "window 16,000 tokens" in demo.stdout.splitlines()[0]  # PREFIT_MODELS's
        assert "summary landed" in demo.stdout, demo.stdout  # the worker computed one
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, output
    assert not [pid for pid in children if _running(pid)]
    redis_url = re.search(r"redis (redis://\S+) \(embedded", output)
    assert redis_url is not None, output
    assert not reachable(redis_url.group(1))


def _wait_healthy(up: subprocess.Popen[str], url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            pytest.fail(f"prefit up exited with {up.returncode}: {up.communicate()[0]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} never answered 200")


def test_up_refuses_a_public_bind_without_api_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """With no PREFIT_API_KEYS, `prefit up --host 0.0.0.0` exits 2 before starting anything."""
    from shared.settings import Settings

    ns = cli.build_parser().parse_args(["up", "--host", "0.0.0.0"])
    assert cli._up(ns, Settings(api_keys="")) == 2
    assert "refusing to listen on 0.0.0.0 with no PREFIT_API_KEYS" in capsys.readouterr().err


def test_demo_talks_to_the_port_the_service_was_started_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --url the demo uses PREFIT_HOST/PREFIT_PORT, as `prefit up` does."""
    made: list[str] = []

    def factory(url: str, key: str | None) -> PrefitClient:
        made.append(url)
        return PrefitClient(url, key, transport=httpx.MockTransport(FakeService()))

    monkeypatch.setattr(cli, "PrefitClient", factory)
    monkeypatch.setenv("PREFIT_PORT", "9123")
    monkeypatch.setenv("PREFIT_HOST", "0.0.0.0")
    cli.get_settings.cache_clear()
    try:
        assert cli.main(["demo", "--generate", "--turns", "2"]) == 0
    finally:
        cli.get_settings.cache_clear()
    assert made == ["http://127.0.0.1:9123"]


def test_demo_log_lines_are_human_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the demo never prints JSON log records, whatever PREFIT_LOG_JSON says."""
    from shared.settings import Settings

    settings = Settings(log_json=True)
    demo = cli.build_parser().parse_args(["demo", "--generate"])
    up = cli.build_parser().parse_args(["up"])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli._log_json(demo, settings) is False
    assert cli._log_json(up, settings) is True  # services keep their configured format
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert cli._log_json(demo, settings) is True


def test_up_warns_when_no_model_is_configured() -> None:
    """The banner says PREFIT_MODELS is empty, and says nothing when it is set."""
    from shared.commands.up import UpOptions, _banner
    from shared.settings import ModelWindow, Settings

    opts = UpOptions(host="127.0.0.1", port=8000)
    empty, out = io.StringIO(), io.StringIO()
    _banner(empty, opts, Settings(), "redis://127.0.0.1:1/0", None)
    assert "warning: PREFIT_MODELS is empty" in empty.getvalue()
    _banner(
        out, opts, Settings(models={"m": ModelWindow(max_input_tokens=9000)}), "redis://x", None
    )
    assert "PREFIT_MODELS" not in out.getvalue()
