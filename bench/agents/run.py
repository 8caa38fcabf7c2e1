"""Real agent CLIs in long scripted sessions, straight to a fake provider and through prefit.

    uv run python -m bench.agents.run --cli claude,codex,codex-chat,opencode,aider,aider2 \
        [--via direct,prefit] [--turns 40] [--window 100000] [--prefit-root DIR] [--out DIR]

For each CLI and each path it starts the scripted provider (`bench.agents.brain`, its own
process), and for `prefit` its own redis-server and `prefit up` (run from `--prefit-root`,
default this checkout, with its `.venv`) on free loopback ports, `PREFIT_MODELS` giving
`agent-model` a `--window` window and both upstream base URLs pointing at the brain. It then
runs one session (two at once, on different tasks, for a name ending in `2`: `aider2`,
`claude2`, ...) with a throwaway HOME, telemetry and
update checks off, bounded by `--timeout`, and always stops what it started.

Clients (installed outside the repo, see docs/benchmarks.md "Real agent CLIs"):
  claude      Claude Code, `claude -p`, Anthropic Messages via ANTHROPIC_BASE_URL
  codex       current Codex, `codex exec`, wire_api = "responses"
  codex-openai  the same on Codex's built-in OpenAI provider (`openai_base_url`), whose
              compaction (with --client-window) is OpenAI's `POST /v1/responses/compact`
  codex-chat  an older Codex that still has wire_api = "chat" (Chat Completions)
  opencode    `opencode run`, an OpenAI-compatible provider (Chat Completions)
  aider       aider's scripting API (bench/agents/aider_session.py) in its own venv
  gemini      Gemini CLI, `gemini -p --yolo`, the Gemini API via GOOGLE_GEMINI_BASE_URL
  <cli>2      two sessions of that client on different tasks at once (aider2, claude2...)

Per session it prints one line: turns completed of `--turns` (the highest turn whose command
came back to the brain), whether the brain's final answer was sent, the agent-loop requests
(plus side requests: titles, summaries, checks), overflows the brain refused, the largest
prompt it saw (o200k, as bench/agents/brain.py counts), the task marker kept in k/n
agent-loop prompts, and for prefit the conversations: how many stored conversations hold
the session's marker (Redis, after the session) and how many distinct conversation ids
prefit's request log shows for the session's requests. Raw logs stay in `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.agents.brain import shell_command
from shared.commands.redisproc import RedisProcess, free_port
from shared.store.compression import unpack_all

ROOT = Path(__file__).resolve().parents[2]
MODEL = "agent-model"
# the models a client calls on its own for side tasks (Gemini CLI: compression, checks),
# configured as a deployment would, with the brain's window
SIDE_MODELS = ("gemini-3-flash-preview", "gemini-2.5-flash", "gemini-2.5-flash-lite")
CLIS = ("claude", "codex", "codex-openai", "codex-chat", "opencode", "aider", "gemini")  # + "2"


@dataclass(frozen=True)
class Tools:
    """Where the clients are installed (all outside the repository)."""

    npm: Path
    codex_old: Path
    aider_venv: Path
    opencode_cache: Path

    def bin(self, name: str) -> str:
        return str(self.npm / "node_modules" / ".bin" / name)


@dataclass
class Session:
    """One client session: its id (in the task marker), its process and where it logs."""

    cli: str
    sid: str
    task: str
    work: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    code: int | None = None
    seconds: float = 0.0


@dataclass
class Run:
    """One CLI on one path: the processes it started, its sessions, its findings."""

    cli: str
    via: str
    out: Path
    brain_port: int = 0
    prefit_port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)

    @property
    def base(self) -> str:
        port = self.prefit_port if self.via == "prefit" else self.brain_port
        return f"http://127.0.0.1:{port}"


def task_text(sid: str) -> str:
    return (
        f"TASK-MARKER-{sid}: the nightly build is flaky. Run the build-log command you are "
        "given step by step, read each log, and tell me when every step is done."
    )


# --- processes ------------------------------------------------------------------------------------


def spawn(
    run: Run, argv: list[str], log: Path, env: dict[str, str], cwd: Path
) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    proc = subprocess.Popen(
        argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        cwd=cwd, start_new_session=True,
    )  # fmt: skip
    run.procs.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left of it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def wait_http(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f}s")


@contextlib.contextmanager
def services(run: Run, args: argparse.Namespace, redis_url: str | None) -> Iterator[None]:
    """The brain, and for `prefit` `prefit up` in front of it; everything stopped on exit."""
    run.brain_port = free_port()
    brain = [
        sys.executable,
        "-m",
        "bench.agents.brain",
        "--port",
        str(run.brain_port),
        "--log",
        str(run.out / "brain.jsonl"),
        "--window",
        str(args.window),
        "--turns",
        str(args.turns),
        "--output-kb",
        str(args.output_kb),
        "--output-style",
        args.output_style,
    ] + (["--dump-dir", str(run.out / "requests")] if args.dump else [])
    brain += ["--task-reply", args.task_reply] if args.task_reply else []
    brain += ["--token-scale", str(args.token_scale)]  # fmt: skip
    try:
        spawn(run, brain, run.out / "brain.out", dict(os.environ), ROOT)
        wait_http(f"http://127.0.0.1:{run.brain_port}/v1/models")
        if run.via == "prefit":
            assert redis_url is not None
            run.prefit_port = free_port()
            prefit = str(args.prefit_root / ".venv" / "bin" / "prefit")
            env = {
                **os.environ,
                "REDIS_URL": redis_url,
                "PREFIT_MODELS": json.dumps(
                    {m: {"max_input_tokens": args.window} for m in (MODEL, *SIDE_MODELS)}
                ),
                "PREFIT_OPENAI_BASE_URL": f"http://127.0.0.1:{run.brain_port}/v1",
                "PREFIT_ANTHROPIC_BASE_URL": f"http://127.0.0.1:{run.brain_port}",
                "PREFIT_GEMINI_BASE_URL": f"http://127.0.0.1:{run.brain_port}",
                "PREFIT_TIKTOKEN_DIR": str(args.tiktoken_dir),
                "PREFIT_LOG_LEVEL": "info",
            }
            argv = [prefit, "up", "--host", "127.0.0.1", "--port", str(run.prefit_port)]
            spawn(run, argv, run.out / "prefit.log", env, args.prefit_root)
            wait_http(f"http://127.0.0.1:{run.prefit_port}/healthz", 90)
        yield
    finally:
        for proc in reversed(run.procs):
            stop(proc)


# --- the clients ----------------------------------------------------------------------------------


def home_env(session: Session) -> dict[str, str]:
    home = session.work / "home"
    home.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "LANG", "TERM", "SHELL", "USER", "LOGNAME", "TZ")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), NO_COLOR="1", CI="1")
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin:" + env.get("PATH", "")
    return env


def claude_argv(run: Run, session: Session, tools: Tools, env: dict[str, str]) -> list[str]:
    env.update(
        ANTHROPIC_BASE_URL=run.base, ANTHROPIC_API_KEY="sk-ant-fake-key",
        ANTHROPIC_MODEL=MODEL, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL, ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL,
        ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL, DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        IS_SANDBOX="1",  # we run as root; the flag below is refused for root otherwise
    )  # fmt: skip
    return [
        tools.bin("claude"), "-p", session.task, "--model", MODEL,
        "--dangerously-skip-permissions", "--max-turns", "200", "--output-format", "text",
    ]  # fmt: skip


def codex_argv(
    run: Run, session: Session, exe: str, wire: str, env: dict[str, str], client_window: int
) -> list[str]:
    codex_home = session.work / "codex-home"
    codex_home.mkdir(parents=True, exist_ok=True)
    if wire == "openai":  # the built-in provider: its compaction is OpenAI's endpoint
        provider = f'model_provider = "openai"\nopenai_base_url = "{run.base}/v1"\n'
        providers = ""
        env.update(OPENAI_API_KEY="sk-fake-key", CODEX_API_KEY="sk-fake-key")
    else:
        provider = 'model_provider = "bench"\n'
        providers = (
            "[model_providers.bench]\n"
            'name = "bench"\n'
            f'base_url = "{run.base}/v1"\n'
            'env_key = "BENCH_API_KEY"\n'
            f'wire_api = "{wire}"\n'
            "request_max_retries = 1\n"
            "stream_max_retries = 1\n"
        )
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        + provider
        + "check_for_update_on_startup = false\n"
        + "[analytics]\nenabled = false\n"
        + providers
    )
    if client_window:  # Codex then compacts on its own near it (90%)
        text = (codex_home / "config.toml").read_text()
        (codex_home / "config.toml").write_text(f"model_context_window = {client_window}\n" + text)
    env.update(CODEX_HOME=str(codex_home), BENCH_API_KEY="sk-fake-key")
    return [
        exe, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        "-C", str(session.work / "repo"), session.task,
    ]  # fmt: skip


def opencode_argv(
    run: Run, session: Session, tools: Tools, env: dict[str, str], client_window: int
) -> list[str]:
    model: dict[str, Any] = {"name": MODEL}
    if client_window:  # opencode then compacts on its own near it
        model["limit"] = {"context": client_window, "output": 32000}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"bench/{MODEL}",
        "small_model": f"bench/{MODEL}",
        "permission": {"bash": "allow", "edit": "allow", "webfetch": "deny"},
        "provider": {
            "bench": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "bench",
                "options": {"baseURL": f"{run.base}/v1", "apiKey": "sk-fake-key"},
                "models": {MODEL: model},
            }
        },
    }
    path = session.work / "opencode.json"
    path.write_text(json.dumps(config))
    tools.opencode_cache.mkdir(parents=True, exist_ok=True)
    env.update(
        OPENCODE_CONFIG=str(path), XDG_CACHE_HOME=str(tools.opencode_cache),
        OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
    )  # fmt: skip
    return [tools.bin("opencode"), "run", "--model", f"bench/{MODEL}", session.task]


def gemini_argv(run: Run, session: Session, tools: Tools, env: dict[str, str]) -> list[str]:
    """Gemini CLI headless, every tool approved; its settings (in the throwaway HOME) turn
    usage statistics, telemetry, update checks, the IDE link and folder trust off."""
    settings = {
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "ide": {"enabled": False},
        "model": {"name": MODEL, "maxSessionTurns": -1},
    }
    config = Path(env["HOME"]) / ".gemini"
    config.mkdir(parents=True, exist_ok=True)
    (config / "settings.json").write_text(json.dumps(settings))
    env.update(
        GEMINI_API_KEY="x", GOOGLE_GEMINI_BASE_URL=run.base, GEMINI_CLI_NO_RELAUNCH="true",
        GEMINI_TELEMETRY_ENABLED="false",
    )  # fmt: skip
    return [
        tools.bin("gemini"), "-p", session.task, "-m", MODEL, "--yolo", "--skip-trust",
        "--output-format", "text",
    ]  # fmt: skip


def aider_argv(run: Run, session: Session, tools: Tools, args: argparse.Namespace,
               env: dict[str, str]) -> list[str]:  # fmt: skip
    env.update(
        OPENAI_API_BASE=f"{run.base}/v1", OPENAI_API_KEY="sk-fake-key",
        LITELLM_LOCAL_MODEL_COST_MAP="True", AIDER_ANALYTICS="false",
        AIDER_CHECK_UPDATE="false",
    )  # fmt: skip
    script = ROOT / "bench" / "agents" / "aider_session.py"
    return [
        str(tools.aider_venv / "bin" / "python"), str(script), "--model", f"openai/{MODEL}",
        "--sid", session.sid, "--task", session.task, "--turns", str(args.turns),
        "--command", shell_command(session.sid, "{turn}", args.output_kb, args.output_style),
    ]  # fmt: skip


def start_session(run: Run, session: Session, tools: Tools, args: argparse.Namespace) -> None:
    repo = session.work / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "README.md").write_text("# flaky build\n\nNotes go here.\n")
    env = home_env(session)
    cli = run.cli.removesuffix("2")
    if cli == "claude":
        argv = claude_argv(run, session, tools, env)
    elif cli == "codex":
        argv = codex_argv(run, session, tools.bin("codex"), "responses", env, args.client_window)
    elif cli == "codex-openai":
        argv = codex_argv(run, session, tools.bin("codex"), "openai", env, args.client_window)
    elif cli == "codex-chat":
        old = str(tools.codex_old / ".bin" / "codex")
        argv = codex_argv(run, session, old, "chat", env, args.client_window)
    elif cli == "opencode":
        argv = opencode_argv(run, session, tools, env, args.client_window)
    elif cli == "gemini":
        argv = gemini_argv(run, session, tools, env)
    else:
        argv = aider_argv(run, session, tools, args, env)
    (session.work / "argv.json").write_text(json.dumps(argv))
    session.proc = spawn(run, argv, session.log, env, repo)


def run_sessions(run: Run, tools: Tools, args: argparse.Namespace) -> None:
    count = 2 if run.cli.endswith("2") else 1
    for i in range(count):
        sid = secrets.token_hex(4)
        work = run.out / f"session-{i}"
        work.mkdir(parents=True, exist_ok=True)
        run.sessions.append(Session(run.cli, sid, task_text(sid), work, work / "client.log"))
    started = time.monotonic()
    for session in run.sessions:
        start_session(run, session, tools, args)
    deadline = started + args.timeout
    for session in run.sessions:
        assert session.proc is not None
        try:
            session.code = session.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(session.proc, grace=5)
            session.code = -999  # timed out
        session.seconds = time.monotonic() - started


# --- what happened --------------------------------------------------------------------------------


def brain_lines(run: Run) -> list[dict[str, Any]]:
    path = run.out / "brain.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stored_conversations(redis_url: str, sids: list[str]) -> dict[str, list[int]]:
    """For each session, the lengths of the stored conversations holding its marker or turns."""
    client = redis.Redis.from_url(redis_url)
    found: dict[str, list[int]] = {sid: [] for sid in sids}
    for key in client.scan_iter(match="prefit:v3:*:msgs", count=1000):
        stored = client.lrange(key, 0, -1)
        messages = b"".join(unpack_all(stored)).decode("utf-8", "replace")
        for sid in sids:
            if f"TASK-MARKER-{sid}" in messages or f"sid={sid} " in messages:
                found[sid].append(len(stored))
    return found


def proxy_log(run: Run) -> list[dict[str, Any]]:
    """prefit's `request.completed` lines of the proxy routes (empty for a direct run)."""
    path = run.out / "prefit.log"
    found: list[dict[str, Any]] = []
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if '"request.completed"' not in line:
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("conversation_id"):
                found.append(rec)
    return found


def own_ms(records: list[dict[str, Any]]) -> str:
    """p50 / max of prefit's own time per request: its latency less the provider's wait."""
    own = sorted(r["latency_ms"] - r.get("upstream_ms", 0.0) for r in records if "latency_ms" in r)
    if not own:
        return "-"
    return f"{own[len(own) // 2]:.1f}/{own[-1]:.0f} ms"


def summarize(
    run: Run, stored: dict[str, list[int]], logged: list[dict[str, Any]], turns: int
) -> list[str]:
    lines = brain_lines(run)
    out = []
    for session in run.sessions:
        mine = [r for r in lines if r.get("sid") == session.sid]
        main = [r for r in mine if r.get("kind") == "main"]
        side = [r for r in lines if r.get("kind") == "side" and r.get("sid") in (None, session.sid)]
        done_turns = max((r["turn"] for r in mine), default=0)
        finished = any(
            r["turn"] >= turns and not r["overflow"] and r.get("answer") == "text" for r in main
        )
        seen = {id(r): r for r in mine + side}.values()  # a side request of the session is both
        overflows = sum(1 for r in seen if r.get("overflow"))
        refused = sum(1 for r in mine if r.get("kind") == "refused")
        largest = max((r.get("prompt", 0) for r in mine + side), default=0)
        kept = sum(1 for r in main if r.get("task"))
        times = [r["t"] for r in main if not r.get("overflow")]
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        gap = f"{1000 * gaps[len(gaps) // 2]:.0f}ms" if gaps else "-"
        lengths = sorted(stored.get(session.sid, []), reverse=True)
        convs = f"{len(lengths)} {lengths}" if run.via == "prefit" else "-"
        out.append(
            f"{run.cli:10} {run.via:6} turns {done_turns:2}/{turns} "
            f"final={'yes' if finished else 'no '} requests {len(main):3}+{len(side):<3} "
            f"overflows {overflows:3} refused {refused} largest {largest:6} "
            f"task {kept}/{len(main)} "
            f"convs {convs} turn gap p50 {gap} exit {session.code} {session.seconds:5.0f}s"
        )
    if run.via == "prefit":
        ids = {r["conversation_id"] for r in logged}
        retried = sum(1 for r in logged if r.get("retries"))
        out.append(
            f"{'':10} {'':6} prefit log: {len(logged)} proxied, {len(ids)} conversation ids, "
            f"{retried} overflow-retried, own time p50/max {own_ms(logged)} "
            "(latency less the provider's wait)"
        )
    return out


# --- main -----------------------------------------------------------------------------------------


def one_run(cli: str, via: str, tools: Tools, args: argparse.Namespace) -> list[str]:
    out = args.out / f"{cli}-{via}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run = Run(cli, via, out)
    store = RedisProcess() if via == "prefit" else None
    url = store.start().url if store is not None else None
    try:
        with services(run, args, url):
            run_sessions(run, tools, args)
            time.sleep(2.0)  # prefit syncs the store after each answer, off the request path
            stored = stored_conversations(url, [s.sid for s in run.sessions]) if url else {}
        return summarize(run, stored, proxy_log(run), args.turns)
    finally:
        if store is not None:
            store.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cli", default="claude,codex-chat,opencode,aider,aider2")
    parser.add_argument("--via", default="direct,prefit")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--output-kb", type=int, default=24)
    parser.add_argument("--output-style", choices=("hex", "text"), default="hex")
    parser.add_argument("--task-reply", help="the brain's answer to aider's task message")
    parser.add_argument("--token-scale", type=float, default=1.0, help="the provider counts x this")
    parser.add_argument(
        "--client-window",
        type=int,
        default=0,
        help="tell Codex and opencode the window (they compact)",
    )
    parser.add_argument("--dump", action="store_true", help="keep every request body the brain got")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per session")
    parser.add_argument("--prefit-root", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "agents-runs")
    parser.add_argument("--npm", type=Path, default=Path("/tmp/agents-npm"))
    parser.add_argument("--codex-old", type=Path, default=Path("/tmp/codex-old/node_modules"))
    parser.add_argument("--aider-venv", type=Path, default=Path("/tmp/aider-venv"))
    parser.add_argument("--tiktoken-dir", type=Path, default=Path("/work/shared/tiktoken"))
    args = parser.parse_args()
    tools = Tools(args.npm, args.codex_old, args.aider_venv, Path("/tmp/agents-opencode-cache"))
    for cli in args.cli.split(","):
        if cli.removesuffix("2") not in CLIS:
            parser.error(f"unknown --cli {cli!r}: choose from {', '.join(CLIS)}, each + '2'")
    branch = subprocess.run(
        ["git", "-C", str(args.prefit_root), "log", "-1", "--format=%h %s"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    print(
        f"prefit from {args.prefit_root} ({branch}); window {args.window}, "
        f"{args.output_kb} KB of {args.output_style} output a turn, "
        f"provider counts o200k x {args.token_scale}",
        flush=True,
    )
    for cli in args.cli.split(","):
        for via in args.via.split(","):
            try:
                lines = one_run(cli, via, tools, args)
            except RuntimeError as exc:  # a service that never came up: the next run goes on
                lines = [f"{cli:10} {via:6} not run: {exc}"]
            for line in lines:
                print(line, flush=True)


if __name__ == "__main__":
    main()
