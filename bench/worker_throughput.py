"""How many summaries one worker process keeps in flight, and what each costs it in CPU.

    uv run python bench/worker_throughput.py [--jobs 1000] [--concurrency 256] [--delay 2.0]

Starts its own redis-server, the fake LLM (`python -m tests.fakellm --delay ...`, a separate
process) and ONE worker process (`celery -A worker.app worker -P threads -c N`), then enqueues
one job per synthetic conversation, each big enough to need a summary (one LLM call per job).
Measured: the most requests the fake held at once (summaries in flight), summaries per minute
from the first enqueue to the last record, and the worker's own CPU (utime + stime from
/proc/<pid>/stat) per task. Goals: >= 200 in flight per process, < 5 ms CPU per task.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from shared.commands.redisproc import RedisProcess, free_port
from shared.commands.up import worker_argv
from shared.hashing import prefix_hash
from shared.messages import Message
from shared.service.jobs import PRIORITY_AHEAD, TASK_NAME, SummaryJob
from shared.settings import Settings
from shared.store import Store, keys
from worker.app import make_app

ROOT = Path(__file__).resolve().parent.parent
TENANT = "bench"
MODEL = "bench-model"
TICKS = os.sysconf("SC_CLK_TCK")


def transcript(i: int, messages: int, chars: int) -> list[Message]:
    """A head and `messages` alternating turns of ~`chars` characters, unique per conversation."""
    word = "benchmark filler text "
    body = (word * (chars // len(word) + 1))[:chars]
    out: list[Message] = [
        {"role": "system", "content": f"conversation {i}"},
        {"role": "user", "content": f"task of conversation {i}"},
    ]
    for k in range(messages):
        role = "assistant" if k % 2 else "user"
        out.append({"role": role, "content": f"{i}-{k} {body}"})
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fake_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/stats", timeout=5) as r:
        stats: dict[str, Any] = json.loads(r.read())
        return stats


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_fake(port: int, delay: float, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.fakellm", "--port", str(port), "--delay", str(delay)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def up() -> bool:
        try:
            fake_stats(port)
            return True
        except OSError:
            return False

    wait_for(up, 30, "the fake LLM")
    return proc


def start_worker(
    settings: Settings, concurrency: int, log: Path, log_level: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "PREFIT_SUMMARIZER_URL": settings.summarizer_url or "",
        "PREFIT_SUMMARIZER_MODEL": "fake",
        "PREFIT_SUMMARY_QUEUE": settings.summary_queue,
        "PREFIT_WORKER_CONCURRENCY": str(concurrency),
        "PREFIT_LOG_LEVEL": log_level,
        "PREFIT_LOG_JSON": "true",
    }
    # the production command line (`prefit worker`), named and quiet for the benchmark
    cmd = [
        *worker_argv(settings, concurrency),
        *("-l", "WARNING", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    app = make_app(settings)
    wait_for(lambda: bool(app.control.ping(timeout=0.5)), 60, "the worker")
    return proc


def seed(store: Store, args: argparse.Namespace, prefix: str, n: int) -> list[SummaryJob]:
    jobs = []
    for i in range(n):
        msgs = transcript(i, args.messages, args.chars)
        msgs[0] = {"role": "system", "content": f"conversation {prefix}{i}"}
        store.conversations.append(TENANT, f"{prefix}{i}", msgs)
        jobs.append(
            SummaryJob(
                TENANT,
                f"{prefix}{i}",
                MODEL,
                args.window,
                args.reserve,
                len(msgs),
                prefix_hash(msgs),
            )
        )
    return jobs


def summarized(store: Store, jobs: list[SummaryJob]) -> int:
    """How many of the jobs' conversations have a summary record (one pipelined round trip)."""
    pipe = store.client.pipeline(transaction=False)
    for job in jobs:
        pipe.zcard(keys.conv_index(TENANT, job.conversation_id))
    return sum(1 for count in pipe.execute() if count)


def phase(
    app: Any, settings: Settings, store: Store, pid: int, jobs: list[SummaryJob], timeout: float
) -> tuple[float, float]:
    """Enqueue `jobs` at once and wait for their records: (wall seconds, worker CPU seconds)."""
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    for job in jobs:
        app.send_task(
            TASK_NAME, kwargs=job.to_kwargs(), queue=settings.summary_queue, priority=PRIORITY_AHEAD
        )
    wait_for(lambda: summarized(store, jobs) >= len(jobs), timeout, "every summary")
    return time.monotonic() - t0, cpu_seconds(pid) - cpu0


def run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    fake_port = free_port()
    with RedisProcess() as redis_proc:
        settings = Settings(
            redis_url=redis_proc.url,
            summarizer_url=f"http://127.0.0.1:{fake_port}/v1",
            summary_queue="bench-summaries",
            retention_s=3600,
        )
        store = Store.from_url(redis_proc.url, settings)
        warmup = seed(store, args, "w", args.warmup)
        jobs = seed(store, args, "c", args.jobs)
        fake = start_fake(fake_port, args.delay, logs / "fake.log")
        worker = start_worker(settings, args.concurrency, logs / "worker.log", args.log_level)
        try:
            app = make_app(settings)
            cold = phase(app, settings, store, worker.pid, warmup, args.timeout) if warmup else None
            time.sleep(1.0)  # back to the idle poll
            elapsed, cpu = phase(app, settings, store, worker.pid, jobs, args.timeout)
            return {
                "elapsed": elapsed,
                "cpu": cpu,
                "cold": cold,
                "stats": fake_stats(fake_port),
                "rss": rss_mb(worker.pid),
                "dead": len(store.dead_letters.list(TENANT)),
                "usage": store.usage.get(TENANT),
            }
        finally:
            for proc in (worker, fake):
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            store.close()


def table(args: argparse.Namespace, r: dict[str, Any]) -> str:
    per_task_ms = r["cpu"] / args.jobs * 1000
    in_flight = r["stats"]["max_in_flight"]
    rows = [
        (
            "summaries in flight (max, at the fake LLM)",
            f"{in_flight}",
            ">= 200",
            "yes" if in_flight >= 200 else "NO",
        ),
        ("summaries per minute", f"{args.jobs / r['elapsed'] * 60:,.0f}", "", ""),
        (
            "worker CPU per task",
            f"{per_task_ms:.2f} ms",
            "< 5 ms",
            "yes" if per_task_ms < 5 else "NO",
        ),
        (
            "jobs / records / LLM calls / dead letters (warm-up included)",
            f"{args.jobs + args.warmup} / {r['usage'].summaries} / {r['stats']['calls']} / "
            f"{r['dead']}",
            "",
            "",
        ),
        ("wall time, first enqueue to last record", f"{r['elapsed']:.1f} s", "", ""),
        ("worker RSS at the end", f"{r['rss']:.0f} MB", "", ""),
    ]
    if r["cold"] is not None:
        _, cpu = r["cold"]
        rows.append(
            (
                f"warm-up: CPU per task of the first {args.warmup} (threads starting)",
                f"{cpu / args.warmup * 1000:.2f} ms",
                "",
                "",
            )
        )
    lines = ["| metric | value | goal | met |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    setup = (
        f"\n1 worker process, threads pool, concurrency {args.concurrency}; fake LLM delay "
        f"{args.delay} s; {args.jobs} conversations of {args.messages + 2} messages "
        f"(~{args.messages * args.chars // 1000} k chars), window {args.window} tokens; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end."
    )
    return "\n".join(lines) + setup


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--delay", type=float, default=2.0, help="fake LLM seconds per answer")
    parser.add_argument(
        "--warmup",
        type=int,
        default=256,
        help="jobs run first, unmeasured: every thread makes its loop, client, connections",
    )
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--chars", type=int, default=800)
    parser.add_argument("--window", type=int, default=8000)
    parser.add_argument("--reserve", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--log-level", default="WARNING", help="the worker's structured logs")
    parser.add_argument("--logs", type=Path, default=None, help="keep process logs here")
    args = parser.parse_args(argv)
    logs = args.logs or Path(os.environ.get("TMPDIR", "/tmp")) / f"prefit-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    print(table(args, run(args, logs)))


if __name__ == "__main__":
    main()
