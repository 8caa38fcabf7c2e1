"""API latency: prepare served from summaries made ahead vs made inline, and append vs length.

    uv run python bench/api_latency.py [--clients 16] [--requests 320] [--appends 100]
                                       [--sizes 1000,16000,64000,128000,200000] [--cluster]

Starts its own redis-server (with `--cluster`, a throwaway 3-master Redis Cluster as the store
and the redis-server as the broker: docs/scaling.md) and the API under uvicorn (`uvicorn
api.app:app`, one process, its own CPU), stores one conversation per size (real transcripts
stitched together, counted with the API's heuristic counter), computes their summaries ahead
of time the way a worker does (`shared.precompute.run_job` with the offline extractive
summarizer), then measures:

- prepare: `--clients` concurrent httpx clients send `--requests` stored prepares per size
  (each response read in full); client-observed p50/p99 and the server's own latency from its
  canonical request log lines;
- the same prepare with the summary made inline, for comparison: a policy given an
  LLMSummarizer against the fake LLM answering in `--llm-delay` s (what a service without
  precomputation pays), one round of `--clients` concurrent prepares per size;
- append: `--appends` sequential one-message appends per size (with expected_length).

The model window is 128k tokens: conversations above its trigger (~105k) are cut and served
from their summary; smaller ones are returned whole. Goals on a 2-core machine: prepare
p50 < 10 ms and p99 < 30 ms at 128k tokens; append latency flat in conversation length.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from shared.clusterproc import ClusterProcess
from shared.counters import HeuristicCounter
from shared.extractive import ExtractiveSummarizer
from shared.head import head_end
from shared.jobs import SummaryJob
from shared.messages import Message, groups
from shared.policy import ContextPolicy
from shared.precompute import run_job
from shared.providers import OpenAIClient
from shared.redisproc import RedisProcess, free_port
from shared.settings import ModelWindow, Settings
from shared.store import Store
from shared.summaries import SummaryBook
from shared.summarizers import LLMSummarizer
from tests.fakellm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT.parent / "shared" / "transcripts"
MODEL, WINDOW, RESERVE = "bench-128k", 128_000, 4_096
TENANT = "local"  # no API keys: the open, loopback-only mode
COUNTER = HeuristicCounter()
TICKS = os.sysconf("SC_CLK_TCK")


# --- conversations -----------------------------------------------------------------------------


def stitched(tokens: int) -> list[Message]:
    """A valid transcript of about `tokens` tokens: real turn groups, stitched end to end."""
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


# --- the API process ---------------------------------------------------------------------------


def start_api(
    redis_url: str, log: Path, workers: int = 1, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """The API under uvicorn on the model's window, open mode, JSON request logs in `log`."""
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
    argv = [sys.executable, "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1",
            "--port", str(port), "--no-access-log", "--log-level", "warning",
            "--workers", str(workers)]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=log.open("wb"), stdout=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the API did not start; see {log}")
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its children (uvicorn's workers), in seconds."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


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


def server_latencies(log: Path, route: str, offset: int, last: int) -> list[float]:
    """latency_ms of the last `last` canonical log lines for `route` written after `offset`."""
    out = [float(e["latency_ms"]) for e in completed(log, offset) if e.get("route") == route]
    return out[-last:]


# --- measurements ------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def load(
    url: str, path: str, body: dict[str, Any] | None, clients: int, total: int
) -> tuple[list[float], float]:
    """Client-observed latencies (ms) of `total` requests from `clients` concurrent clients
    (each response read in full), and the wall time they took (s). GET when `body` is None."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def call() -> None:
            t = time.perf_counter()
            r = await (client.get(path) if body is None else client.post(path, json=body))
            _ = r.content
            latencies.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text

        async def one_client(n: int) -> None:
            for _ in range(n):
                await call()

        # warm up: the server's caches, and every connection of the pool opened
        await asyncio.gather(*(one_client(2) for _ in range(clients)))
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one_client(total // clients) for _ in range(clients)))
        return latencies, time.perf_counter() - started


def appends(url: str, cid: str, length: int, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(n):
            message = {"role": "user", "content": f"one more question, number {i}"}
            body = {"messages": [message], "model": MODEL, "expected_length": length + i}
            t = time.perf_counter()
            r = client.post(f"/v1/conversations/{cid}/messages", json=body)
            out.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    return out


async def inline(transcript: list[Message], fake: FakeLLM, clients: int) -> list[float]:
    """Seconds per prepare when the summary is made inline (a fresh book each: no reuse)."""
    client = OpenAIClient(fake.base_url, None, timeout=httpx.Timeout(120.0))
    policy = ContextPolicy(
        WINDOW,
        reserve_output=RESERVE,
        counter=HeuristicCounter(),
        summarizer=LLMSummarizer(client, "fake-summarizer"),
    )

    async def one() -> float:
        t = time.perf_counter()
        await policy.prepare(transcript, model=MODEL, book=SummaryBook())
        return time.perf_counter() - t

    return list(await asyncio.gather(*(one() for _ in range(clients))))


def precompute(store: Store, settings: Settings, cid: str, transcript: list[Message]) -> int:
    """Make the conversation's summaries as a worker would; returns how many records exist."""
    hashes = store.conversations.hashes(TENANT, cid)
    job = SummaryJob(TENANT, cid, MODEL, WINDOW, RESERVE, len(transcript), hashes[-1])
    asyncio.run(
        run_job(
            job, store=store, summarizer=ExtractiveSummarizer(), settings=settings, owner="bench"
        )
    )
    return len(store.records.list(TENANT, cid))


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,16000,64000,128000,200000")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--single", type=int, default=100, help="sequential prepares per size")
    ap.add_argument("--appends", type=int, default=100)
    ap.add_argument("--llm-delay", type=float, default=1.5)
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    ap.add_argument("--cluster", action="store_true", help="the store on a Redis Cluster")
    args = ap.parse_args()
    with (
        RedisProcess() as redis,
        ClusterProcess() if args.cluster else contextlib.nullcontext() as cluster,
        FakeLLM(delay=args.llm_delay) as fake,
        tempfile.TemporaryDirectory() as tmp,
    ):
        store_url = cluster.url if cluster is not None else redis.url
        settings = Settings(
            redis_url=store_url,
            redis_cluster=cluster is not None,
            broker_url=redis.url,
            models={MODEL: ModelWindow(max_input_tokens=WINDOW)},
        )
        store = Store.from_url(store_url, settings)
        log = Path(tmp) / "api.log"
        mode = {"PREFIT_REDIS_CLUSTER": str(cluster is not None), "PREFIT_BROKER_URL": redis.url}
        proc, url = start_api(store_url, log, args.workers, mode)
        try:
            floor, wall = asyncio.run(load(url, "/healthz", None, args.clients, args.requests))
            rows = [
                measure(url, log, store, settings, fake, size, args, proc.pid)
                for size in _sizes(args)
            ]
        finally:
            proc.terminate()
            proc.wait(10)
            store.close()
    print_table(rows, args, (pct(floor, 50), pct(floor, 99), len(floor) / wall))


def _sizes(args: argparse.Namespace) -> list[int]:
    return [int(s) for s in args.sizes.split(",")]


def measure(
    url: str,
    log: Path,
    store: Store,
    settings: Settings,
    fake: FakeLLM,
    size: int,
    args: argparse.Namespace,
    pid: int,
) -> dict[str, Any]:
    """Every number of one conversation size (`pid`: the API's, for its CPU time)."""
    transcript = stitched(size)
    cid = f"bench-{size}"
    body = {"messages": transcript, "model": MODEL}
    r = httpx.put(f"{url}/v1/conversations/{cid}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    records = precompute(store, settings, cid, transcript)
    path, prep = f"/v1/conversations/{cid}/prepare", {"model": MODEL}
    report = httpx.post(f"{url}{path}", json=prep, timeout=60).json()["report"]
    single, _ = asyncio.run(load(url, path, prep, 1, args.single))
    offset, cpu = log.stat().st_size, cpu_seconds(pid)
    loaded, wall = asyncio.run(load(url, path, prep, args.clients, args.requests))
    cpu = cpu_seconds(pid) - cpu
    server = server_latencies(
        log, "/v1/conversations/{conversation_id}/prepare", offset, len(loaded)
    )
    over = report["tokens_before"] > report["trigger_tokens"]
    slow = asyncio.run(inline(transcript, fake, args.clients)) if over else []
    adds = appends(url, cid, len(transcript), args.appends)
    row = {
        "tokens": r.json()["tokens"], "messages": len(transcript), "records": records,
        "summary": report["summary"] is not None, "stale": report["stale"],
        "out_tokens": report["tokens_after"],
        "one": (pct(single, 50), pct(single, 99)),
        "load": (pct(loaded, 50), pct(loaded, 99)),
        "server": (pct(server, 50), pct(server, 99)) if server else (math.nan, math.nan),
        "rps": len(loaded) / wall,
        "cpu_ms": cpu * 1000 / (len(loaded) + 2 * args.clients),  # warm-up ran in the window
        "inline": (pct(slow, 50), pct(slow, 99)) if slow else None,
        "append": (pct(adds, 50), pct(adds, 99)),
    }  # fmt: skip
    print(f"done {size}: {row}", file=sys.stderr, flush=True)
    return row


def print_table(
    rows: list[dict[str, Any]], args: argparse.Namespace, floor: tuple[float, float, float]
) -> None:
    print(
        f"\nstore: {'a 3-master Redis Cluster' if args.cluster else 'a redis-server'}; "
        f"uvicorn workers: {args.workers}; prepare: 1 client x {args.single} requests, then "
        f"{args.clients} concurrent clients x {args.requests} requests per size; inline "
        f"summary: {args.clients} concurrent, LLM answering in {args.llm_delay} s; append: "
        f"{args.appends} sequential. Latencies in ms (inline in s), p50 / p99.\n"
    )
    print(
        "| conversation tokens | messages | served from | prompt tokens | prepare, 1 client "
        f"| prepare, {args.clients} clients | server-side, {args.clients} clients | prepares/s "
        "| summary made inline | append, 1 client |"
    )
    print("|" + " --- |" * 11)
    for r in rows:
        used = f"summary ({r['records']} records)" if r["summary"] else "whole (fits)"
        used += " STALE" if r["stale"] else ""
        inline = "n/a (under trigger)" if r["inline"] is None else _pair(r["inline"], ".1f")
        print(
            f"| {r['tokens']:,} | {r['messages']} | {used} | {r['out_tokens']:,} | "
            f"{_pair(r['one'])} | {_pair(r['load'])} | {_pair(r['server'])} | {r['rps']:.0f} | "
            f"{r['cpu_ms']:.1f} | "
            f"{inline} | {_pair(r['append'])} |"
        )
    print(
        f"\nfloor: GET /healthz under the same {args.clients}-client load: "
        f"{_pair(floor[:2])} ms, {floor[2]:.0f} requests/s"
    )


def _pair(values: tuple[float, ...], fmt: str = ".1f") -> str:
    return " / ".join(format(v, fmt) for v in values)


if __name__ == "__main__":
    main()
