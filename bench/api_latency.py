"""API latency and throughput: the stored prepare, by clients and API processes.

    uv run python -m bench.api_latency [--sizes 128000] [--processes 1,2] [--clients 1,16]
        [--rounds 3] [--single 1000] [--requests 3200] [--inline] [--appends 100]
        [--server-root DIR] [--uvicorn-args "--loop asyncio --http h11"] [--cluster]

Starts its own redis-server (with `--cluster`, also a throwaway 3-master Redis Cluster as the
store, the redis-server staying the broker: docs/scaling.md) and the API as `prefit up
--api-workers N` runs it (uvicorn, N processes on one port, a metrics directory of their own
when N > 1), stores one
conversation per size (real transcripts stitched end to end, counted with the API's
heuristic counter), and computes its summaries ahead of time the way a worker does
(`shared.service.precompute.run_job`, offline extractive summarizer). The model window is 128k:
conversations over its trigger (~105k tokens) are served from their summary.

Then, `--rounds` times, for each number of API processes in turn (a fresh API each time, so
that 1 and 2 processes alternate and machine noise hits both), for each number of clients:
stored prepares (`--single` requests for 1 client, `--requests` for more, each client one
keep-alive connection, bench/loadgen.py), then as many `GET /healthz` with the same clients
(the floor: what the server and the load generator cost when the handler does nothing).
Each row reports client-observed p50 / p99, requests per second, the server's CPU per
prepare (utime + stime of every API process, warm-up requests included in the count) and
the load generator's own CPU per request. A summary gives each figure's range over rounds.

`--server-root` runs the API of another checkout (an older commit's tree) under the same
load, for before and after; `--uvicorn-args` passes uvicorn options (the code before
uvloop and httptools were dependencies ran `--loop asyncio --http h11`). `--inline` adds
the same prepare with the summary made inline against the fake LLM (tests/fakellm.py)
answering in 1.5 s; `--appends N` adds N sequential one-message appends per size. Goals
at 128k: 1 ms of server CPU per stored prepare; 2 processes >= 1.5x the prepares/s of one.
Prints markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from bench import loadgen
from bench.harness import (
    MODEL,
    RESERVE,
    ROOT,
    WINDOW,
    bench_settings,
    cpu_by_process,
    load_average,
    owner_of,
    pct,
    precompute,
    server_options,
    settle,
    start_api,
    stitched,
    stop,
)
from shared.commands.clusterproc import ClusterProcess
from shared.commands.redisproc import RedisProcess
from shared.counting.counters import HeuristicCounter
from shared.policy import ContextPolicy
from shared.providers import OpenAIClient
from shared.settings import Settings
from shared.store import Store
from shared.summaries.book import SummaryBook
from shared.summaries.summarizers import LLMSummarizer
from tests.fakellm import FakeLLM

WARMUP = 2  # requests per client before the measured ones


@dataclass(frozen=True)
class Row:
    """One measurement: a size, a round, a number of API processes and of clients."""

    size: int
    round: int
    processes: int
    clients: int
    prepare: loadgen.Load
    server_cpu_ms: float
    floor: loadgen.Load
    load_average: str
    shares: str  # of the API's CPU, per process (the uvicorn supervisor among them)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="128000")
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--single", type=int, default=1000, help="prepares with 1 client")
    ap.add_argument("--requests", type=int, default=3200, help="prepares with more clients")
    ap.add_argument("--inline", action="store_true", help="also time a summary made inline")
    ap.add_argument("--llm-delay", type=float, default=1.5)
    ap.add_argument("--appends", type=int, default=0, help="sequential appends per size")
    ap.add_argument("--cluster", action="store_true", help="the store on a Redis Cluster")
    server_options(ap)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with (
        RedisProcess() as redis,
        ClusterProcess() if args.cluster else contextlib.nullcontext() as cluster,
        tempfile.TemporaryDirectory() as tmp,
    ):
        url = cluster.url if cluster is not None else redis.url
        args.store_env = {
            "PREFIT_REDIS_CLUSTER": str(cluster is not None),
            "PREFIT_BROKER_URL": redis.url,
        }
        settings = bench_settings(url).model_copy(
            update={"redis_cluster": cluster is not None, "broker_url": redis.url}
        )
        store = Store.from_url(url, settings)
        log = Path(tmp) / "api.log"
        try:
            served = store_conversations(url, log, store, settings, sizes, args)
            rows = [
                row
                for r in range(args.rounds)
                for processes in _ints(args.processes)
                for row in measure(url, log, Path(tmp), r, processes, sizes, args)
            ]
            extras = {size: extra(url, log, size, args) for size in sizes}
        finally:
            store.close()
    print_tables(rows, served, extras, args)


def store_conversations(
    redis_url: str,
    log: Path,
    store: Store,
    settings: Settings,
    sizes: Sequence[int],
    args: argparse.Namespace,
) -> dict[int, str]:
    """Each size's conversation stored and summarized; what its prepare is served from."""
    proc, url = _api(redis_url, log, 1, args)
    served = {}
    try:
        for size in sizes:
            transcript = stitched(size)
            r = httpx.put(
                f"{url}{_path(size, '')}",
                json={"messages": transcript, "model": MODEL},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            status = precompute(store, settings, f"bench-{size}", len(transcript))
            report = httpx.post(f"{url}{_path(size)}", json={"model": MODEL}, timeout=60).json()
            report = report["report"]
            used = f"summary@{report['summary']['upto']}" if report["summary"] else "whole"
            served[size] = (
                f"{r.json()['tokens']:,} tokens, {len(transcript)} messages; served from {used} "
                f"({report['tokens_after']:,} tokens{', STALE' if report['stale'] else ''}); "
                f"summary job: {status}"
            )
    finally:
        stop(proc)
    return served


def measure(
    redis_url: str,
    log: Path,
    tmp: Path,
    round_: int,
    processes: int,
    sizes: Sequence[int],
    args: argparse.Namespace,
) -> list[Row]:
    """Every size and number of clients against a fresh API of `processes` processes."""
    proc, url = _api(redis_url, log, processes, args, tmp / f"metrics-{round_}-{processes}")
    rows = []
    body = json.dumps({"model": MODEL}).encode()
    try:
        most = max(_ints(args.clients))
        for size in sizes:  # every process's cache filled, its start-up work done
            loadgen.run(url, _path(size), body, clients=most, total=20 * most)
        settle(proc.pid)
        port = int(url.rsplit(":", 1)[1])
        spread = None if processes == 1 else (partial(owner_of, proc.pid, port), processes)
        for size in sizes:
            for clients in _ints(args.clients):
                total = args.single if clients == 1 else args.requests
                before = cpu_by_process(proc.pid)
                prepare = loadgen.run(
                    url, _path(size), body, clients=clients, total=total, spread=spread
                )
                spent = _spent(before, cpu_by_process(proc.pid))
                floor = loadgen.run(
                    url, "/healthz", None, clients=clients, total=total, spread=spread
                )
                cpu_ms = sum(spent) * 1000 / (total + WARMUP * clients)
                row = Row(
                    size, round_, processes, clients, prepare, cpu_ms, floor, load_average(),
                    " / ".join(f"{x / sum(spent):.2f}" for x in spent),
                )  # fmt: skip
                print(f"round {round_}: {_line(row)}", file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        stop(proc)
    return rows


def extra(redis_url: str, log: Path, size: int, args: argparse.Namespace) -> str:
    """The same prepare with its summary made inline, and appends: on request only."""
    notes = []
    if args.inline:
        with FakeLLM(delay=args.llm_delay) as fake:
            took = asyncio.run(inline(stitched(size), fake.base_url, max(_ints(args.clients))))
        notes.append(f"summary made inline: {pct(took, 50):.1f} / {pct(took, 99):.1f} s")
    if args.appends:
        proc, url = _api(redis_url, log, 1, args)
        try:
            took = appends(url, size, args.appends)
        finally:
            stop(proc)
        notes.append(f"append, 1 client: {pct(took, 50):.1f} / {pct(took, 99):.1f} ms")
    return "; ".join(notes)


async def inline(transcript: list[dict[str, object]], llm_url: str, clients: int) -> list[float]:
    """Seconds per prepare when the summary is made inline (a fresh book each: no reuse)."""
    client = OpenAIClient(llm_url, None, timeout=httpx.Timeout(120.0))
    summarizer = LLMSummarizer(client, "fake-summarizer")
    policy = ContextPolicy(
        WINDOW, reserve_output=RESERVE, counter=HeuristicCounter(), summarizer=summarizer
    )

    async def one() -> float:
        t = time.perf_counter()
        await policy.prepare(transcript, model=MODEL, book=SummaryBook())
        return time.perf_counter() - t

    return list(await asyncio.gather(*(one() for _ in range(clients))))


def appends(url: str, size: int, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        length = client.get(_path(size, "")).json()["length"]
        for i in range(n):
            message = {"role": "user", "content": f"one more question, number {i}"}
            body = {"messages": [message], "model": MODEL, "expected_length": length + i}
            t = time.perf_counter()
            r = client.post(_path(size, "/messages"), json=body)
            out.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    return out


# --- output ------------------------------------------------------------------------------------


def print_tables(
    rows: list[Row], served: dict[int, str], extras: dict[int, str], args: argparse.Namespace
) -> None:
    root = "this checkout" if args.server_root == ROOT else str(args.server_root)
    print(f"\nAPI from {root} {args.uvicorn_args}; {args.rounds} rounds; ms, p50 / p99.")
    for size in served:
        print(f"\n{size:,}: {served[size]}" + (f"; {extras[size]}" if extras[size] else ""))
    print(
        "\n| size | round | API processes | clients | prepare | prepares/s | server CPU ms / "
        "prepare | CPU share per process | load generator CPU ms / request | /healthz "
        "| /healthz req/s | load average |"
    )
    print("|" + " --- |" * 12)
    for r in rows:
        print(f"| {r.size:,} | {r.round} | {_line(r)} | {r.load_average} |")
    print("\nRanges over the rounds:\n")
    print("| size | API processes | clients | p50 | p99 | prepares/s | server CPU ms / prepare |")
    print("|" + " --- |" * 7)
    keys = sorted({(r.size, r.processes, r.clients) for r in rows})
    for size, processes, clients in keys:
        same = [r for r in rows if (r.size, r.processes, r.clients) == (size, processes, clients)]
        print(
            f"| {size:,} | {processes} | {clients} "
            f"| {_span([pct(r.prepare.latencies, 50) for r in same])} "
            f"| {_span([pct(r.prepare.latencies, 99) for r in same])} "
            f"| {_span([r.prepare.per_second for r in same], '.0f')} "
            f"| {_span([r.server_cpu_ms for r in same], '.2f')} |"
        )
    print_ratios(rows)


def print_ratios(rows: list[Row]) -> None:
    """Prepares per second of the most processes over one process, round by round."""
    most = max(r.processes for r in rows)
    if most == 1:
        return
    for size, clients in sorted({(r.size, r.clients) for r in rows}):
        ratios = []
        for round_ in sorted({r.round for r in rows}):
            by = {
                r.processes: r
                for r in rows
                if (r.size, r.clients, r.round) == (size, clients, round_)
            }
            if 1 in by and most in by:
                ratios.append(by[most].prepare.per_second / by[1].prepare.per_second)
        print(
            f"\n{size:,}, {clients} clients: {most} processes serve {_span(ratios, '.2f')}x "
            "the prepares per second of one (per round)"
        )


def _spent(before: dict[int, float], after: dict[int, float]) -> list[float]:
    return sorted((after[p] - before.get(p, 0.0) for p in after), reverse=True)


def _line(r: Row) -> str:
    p, f = r.prepare, r.floor
    return (
        f"{r.processes} | {r.clients} | {_pair(p.latencies)} | {p.per_second:.0f} "
        f"| {r.server_cpu_ms:.2f} | {r.shares} | {p.cpu_ms:.2f} | {_pair(f.latencies)} "
        f"| {f.per_second:.0f}"
    )


def _pair(values: Sequence[float]) -> str:
    return f"{pct(values, 50):.1f} / {pct(values, 99):.1f}"


def _span(values: Sequence[float], fmt: str = ".1f") -> str:
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _path(size: int, tail: str = "/prepare") -> str:
    return f"/v1/conversations/bench-{size}{tail}"


def _api(
    redis_url: str,
    log: Path,
    processes: int,
    args: argparse.Namespace,
    metrics: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    if metrics is not None and processes > 1:
        metrics.mkdir()
    return start_api(
        redis_url,
        log,
        processes,
        root=args.server_root,
        metrics_dir=metrics if processes > 1 else None,
        extra_env=args.store_env,
        uvicorn_args=shlex.split(args.uvicorn_args),
    )


if __name__ == "__main__":
    main()
