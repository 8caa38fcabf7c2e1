"""What the HTTP benchmarks share.

The conversations they replay, the API they start, the server's CPU time, percentiles,
request logs.

The API runs as `prefit up` runs it (`shared.commands.up.api_argv`: uvicorn, one or several
processes; several get a metrics directory of their own), from this checkout or from another
one (`root`: an older commit's tree, to measure before and after with the same load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.commands.redisproc import free_port
from shared.commands.up import METRICS_DIR, api_argv
from shared.counting.counters import HeuristicCounter
from shared.head import head_end
from shared.logs import configure_logging
from shared.messages import Message, groups
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.settings import ModelWindow, Settings
from shared.store import Store
from shared.summaries.extractive import ExtractiveSummarizer

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT.parent / "shared" / "transcripts"
MODEL, WINDOW, RESERVE = "bench-128k", 128_000, 4_096
TENANT = "local"  # no API keys: the open, loopback-only mode
COUNTER = HeuristicCounter()
# Coding agents cap one tool output far below this (Claude Code: 30,000 characters), so a
# larger message (one transcript ends on a 248k-token output) is left out of the stitched
# conversations: it would sit in every later turn's protected tail, which no summary covers.
MAX_MESSAGE_TOKENS = 32_000
TICKS = os.sysconf("SC_CLK_TCK")


# --- conversations -----------------------------------------------------------------------------


def stitched(tokens: int) -> list[Message]:
    """A valid transcript of about `tokens` tokens: real turn groups, stitched end to end
    (leaving out those with a message over `MAX_MESSAGE_TOKENS`)."""
    sources = [json.loads(p.read_text())["messages"] for p in sorted(TRANSCRIPTS.glob("*.json"))]
    sources = [s for s in sources if s] or [synthetic_source()]
    head_src = next(s for s in sources if head_end(s) >= 2)
    out = list(head_src[: head_end(head_src)])
    size = COUNTER.count(out)
    while size < tokens:
        for src in sources:
            for a, b in groups(src, head_end(src)):
                chunk = src[a:b]
                if chunk[0].get("role") == "tool" or (b - a == 1 and _pending_call(chunk[0])):
                    continue
                if any(COUNTER.count_message(m) > MAX_MESSAGE_TOKENS for m in chunk):
                    continue
                out.extend(chunk)
                size += sum(COUNTER.count_message(m) for m in chunk)
                if size >= tokens:
                    return out
    return out


def _pending_call(m: Message) -> bool:
    return m.get("role") == "assistant" and bool(m.get("tool_calls"))


def synthetic_source() -> list[Message]:
    text = "benchmark filler text " * 60
    out: list[Message] = [
        {"role": "system", "content": "bench"},
        {"role": "user", "content": "task"},
    ]
    for k in range(200):
        out.append({"role": "assistant" if k % 2 else "user", "content": f"{k} {text}"})
    return out


def precompute(store: Store, settings: Settings, cid: str, length: int) -> str:
    """Make the conversation's summary records as a worker would; the job's status."""
    hashes = store.conversations.hashes(TENANT, cid)
    job = SummaryJob(TENANT, cid, MODEL, WINDOW, RESERVE, length, hashes[-1])
    summarizer = ExtractiveSummarizer()
    done = asyncio.run(
        run_job(job, store=store, summarizer=summarizer, settings=settings, owner="bench")
    )
    return done.status


# --- the API -----------------------------------------------------------------------------------


def server_options(ap: argparse.ArgumentParser) -> None:
    """`--server-root` and `--uvicorn-args`: the API of another checkout, for before/after."""
    ap.add_argument("--server-root", type=Path, default=ROOT, help="the API's checkout")
    ap.add_argument("--uvicorn-args", default="", help="extra uvicorn options")


def bench_settings(redis_url: str) -> Settings:
    """The benchmark's settings (its model's window, on `redis_url`); its own log lines go to
    stderr, warnings only, so that stdout holds the tables."""
    configure_logging(json=False, level="WARNING")
    return Settings(redis_url=redis_url, models={MODEL: ModelWindow(max_input_tokens=WINDOW)})


def start_api(
    redis_url: str,
    log: Path,
    processes: int = 1,
    *,
    root: Path = ROOT,
    metrics_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    uvicorn_args: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """The API from the checkout at `root`, as `prefit up` runs it, on the model's window,
    open mode, JSON request logs in `log`; `metrics_dir` for several processes."""
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PREFIT_MODELS": json.dumps({MODEL: {"max_input_tokens": WINDOW}}),
        "PREFIT_API_KEYS": "",
        "PREFIT_LOG_JSON": "true",
        "PREFIT_SUMMARY_QUEUE": "bench-summaries",  # no worker consumes it here
        **(extra_env or {}),
    }
    if metrics_dir is not None:
        env[METRICS_DIR] = str(metrics_dir)
    argv = [*api_argv("127.0.0.1", port, processes), *uvicorn_args]
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stderr=log.open("ab"), stdout=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    wait_up(f"{url}/healthz", proc, "the API")
    return proc, url


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60) -> None:
    """Until `url` answers at all (any HTTP status), or exit if `proc` died."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(15)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its children (uvicorn's workers), in seconds."""
    return sum(cpu_by_process(pid).values())


def cpu_by_process(pid: int) -> dict[int, float]:
    """utime + stime, in seconds, of a process and of each of its children."""
    return {p: cpu_seconds_of(p) for p in [pid, *children(pid)]}


def cpu_seconds_of(pid: int) -> float:
    """utime + stime of one process, in seconds (0 once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def settle(pid: int, quiet_ms: float = 5.0, timeout_s: float = 20.0) -> None:
    """Wait until the process tree is idle (under `quiet_ms` of CPU in 0.3 s): the API
    starts with work of its own (Celery's imports, in a thread), not a request's to bill."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(0.3)
        if (cpu_seconds(pid) - before) * 1000 < quiet_ms:
            return


def owner_of(pid: int, server_port: int, client_port: int) -> int | None:
    """Which child of `pid` (an API process) holds the server end of the connection from
    `client_port`: its socket's inode, from /proc/net/tcp, among each child's open files."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].split(":"), fields[2].split(":")
        if int(local[1], 16) == server_port and int(remote[1], 16) == client_port:
            inode = fields[9]
    if inode is None:
        return None
    for child in children(pid):
        try:
            if any(
                os.readlink(fd) == f"socket:[{inode}]" for fd in Path(f"/proc/{child}/fd").iterdir()
            ):
                return child
        except OSError:
            continue
    return None


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# --- figures -----------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def completed(log: Path, offset: int) -> list[dict[str, Any]]:
    """The canonical `request.completed` log records written to `log` after `offset`."""
    with log.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode().splitlines()
    out = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("event") == "request.completed":
            out.append(e)
    return out
