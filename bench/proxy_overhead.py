"""Proxy overhead: the latency prefit adds in front of a provider, at 8k to 512k tokens.

    uv run python -m bench.proxy_overhead [--sizes 8000,32000,128000,512000] [--turns 100]

Starts its own redis-server, the fake provider (`python -m tests.fakeprovider`, its own
process, answering at once) and the API (`uvicorn api.app:app`, one process, no API keys,
request logs on) with `PREFIT_OPENAI_BASE_URL` pointing at the fake. For each size it plays
one conversation (real transcripts stitched end to end, as bench/api_latency.py builds them)
turn by turn, as a client resends it: each turn adds an assistant answer and a user message.
Every turn is sent twice, straight to the fake and through prefit, alternately, with the same
pre-encoded bytes on keep-alive connections, so machine noise hits both paths alike; then
the same again with `stream: true` (time to the first byte and to the end). The model window
is 128k: the 8k and 32k conversations fit and go through unchanged; the 128k and 512k ones
(a 2 MB body: a coding agent's client transcript that prefit, not the agent, keeps compact)
are over the trigger and are served from their summary, made ahead of time the way a worker
does (`shared.service.precompute.run_job`, offline extractive summarizer) after the first turn
stored it. Goals: < 5 ms added at p50 for 128k tokens; the first streamed byte < 5 ms later
than direct, at 512k tokens too.
Prints a markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    MODEL,
    RESERVE,
    ROOT,
    WINDOW,
    bench_settings,
    completed,
    cpu_seconds,
    load_average,
    pct,
    server_options,
    start_api,
    stitched,
    wait_up,
)
from shared.commands.redisproc import RedisProcess, free_port
from shared.errors import NotFound
from shared.extractive import ExtractiveSummarizer
from shared.messages import Message
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.settings import Settings
from shared.store import Store

TENANT = "local"


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=log.open("wb"), stdout=subprocess.DEVNULL
    )


def start_fake(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakeprovider", "--port", str(port)]
    proc = start(argv, dict(os.environ), log)
    url = f"http://127.0.0.1:{port}"
    wait_up(f"{url}/v1/chat/completions", proc, "the fake provider")
    return proc, url


def start_proxy(
    redis_url: str, fake_url: str, log: Path, args: argparse.Namespace
) -> tuple[subprocess.Popen[bytes], str]:
    """The API (as bench/api_latency.py starts it) forwarding OpenAI requests to the fake."""
    env = {"PREFIT_OPENAI_BASE_URL": f"{fake_url}/v1"}
    return start_api(
        redis_url,
        log,
        root=args.server_root,
        extra_env=env,
        uvicorn_args=shlex.split(args.uvicorn_args),
    )


# --- one request, timed ------------------------------------------------------------------------


def timed(client: httpx.Client, url: str, body: bytes) -> tuple[float, float, httpx.Headers]:
    """(ms to the first byte of the answer, ms to its end, headers) of one POST."""
    started = time.perf_counter()
    with client.stream("POST", url, content=body, headers=JSON) as r:
        first = None
        for _ in r.iter_raw():
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        assert r.status_code == 200, r.read()
        headers = r.headers
    return (first or end) * 1000 - started * 1000, (end - started) * 1000, headers


JSON = {"content-type": "application/json"}


def turns(transcript: list[Message], n: int, stream: bool) -> list[bytes]:
    """`n` request bodies: the transcript grown by one exchange per turn."""
    out = []
    messages = list(transcript)
    for k in range(n):
        body = {"model": MODEL, "messages": messages, "stream": stream, "max_tokens": 256}
        out.append(json.dumps(body).encode())
        messages = [
            *messages,
            {"role": "assistant", "content": f"Answer {k}: looked at it, here is what I found."},
            {"role": "user", "content": f"Thanks. Next question, number {k}?"},
        ]
    return out


def play(
    direct: str,
    proxied: str,
    bodies: list[bytes],
    on_first: Callable[[httpx.Headers], None],
    pause: float = 0.0,
) -> dict[str, list[float]]:
    """Each body straight to the fake and through prefit, alternately (who goes first too),
    `pause` seconds apart (a client's think time; a real provider's answer is far longer)."""
    got: dict[str, list[float]] = {k: [] for k in ("d_first", "d_end", "p_first", "p_end")}
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        for k, body in enumerate(bodies):
            time.sleep(pause)
            order = [("d", a, direct), ("p", b, proxied)]
            for tag, client, url in order if k % 2 else order[::-1]:
                first, end, headers = timed(client, url, body)
                if tag == "p" and k == 0:
                    on_first(headers)
                got[f"{tag}_first"].append(first)
                got[f"{tag}_end"].append(end)
    return got


def _stored(store: Store, conv: str) -> int:
    try:
        return store.conversations.length(TENANT, conv)
    except NotFound:
        return 0


def summarize(store: Store, settings: Settings, conv: str, length: int) -> str:
    """Write the conversation's summary records as a worker would; their status."""
    deadline = time.monotonic() + 30
    while _stored(store, conv) < length:  # synced after the answer
        assert time.monotonic() < deadline, "the proxy never stored the conversation"
        time.sleep(0.05)
    last = store.conversations.hashes(TENANT, conv)[-1]
    job = SummaryJob(TENANT, conv, MODEL, WINDOW, RESERVE, length, last)
    outcome = asyncio.run(
        run_job(
            job, store=store, summarizer=ExtractiveSummarizer(), settings=settings, owner="bench"
        )
    )
    return outcome.status


def own_times(log: Path, offset: int) -> list[float]:
    """prefit's own ms per proxied request logged after `offset`: its latency (to the last
    byte) less the time it waited for the provider's answers to start (`upstream_ms`)."""
    return [
        float(e["latency_ms"]) - float(e["upstream_ms"])
        for e in completed(log, offset)
        if e.get("upstream_ms") is not None
    ]


def measure(
    direct: str,
    proxied: str,
    store: Store,
    settings: Settings,
    size: int,
    n: int,
    pause: float,
    log: Path,
    pid: int,
) -> dict[str, Any]:
    transcript = stitched(size)
    seen: dict[str, str] = {}

    def first_turn(headers: httpx.Headers) -> None:
        seen.update({k: v for k, v in headers.items() if k.startswith("x-prefit-")})

    # warm: store the conversation, make its summary, fill the API's caches
    warm = turns(transcript, 2, False)
    play(direct, proxied, warm[:1], first_turn)
    status = summarize(store, settings, seen["x-prefit-conversation"], len(transcript))
    play(direct, proxied, warm[1:], lambda h: None)
    row: dict[str, Any] = {"size": size, "messages": len(transcript), "summary": status}
    after: dict[str, str] = {}
    for stream in (False, True):
        after.clear()
        offset, cpu = log.stat().st_size, cpu_seconds(pid)
        got = play(direct, proxied, turns(transcript, n, stream), after.update, pause)
        row[stream] = got
        row[("cpu", stream)] = (cpu_seconds(pid) - cpu) * 1000 / n
        row[("own", stream)] = own_times(log, offset)
    row["headers"] = after
    print(f"done {size}: {after}", file=sys.stderr, flush=True)
    return row


def added(got: dict[str, list[float]], key: str) -> list[float]:
    return [p - d for p, d in zip(got[f"p_{key}"], got[f"d_{key}"], strict=True)]


def pair(values: list[float]) -> str:
    return f"{pct(values, 50):.2f} / {pct(values, 99):.2f}"


def print_table(rows: list[dict[str, Any]], n: int, pause: float) -> None:
    print(
        f"\n{n} turns per size and mode, {pause * 1000:.0f} ms apart, each sent straight to "
        "the fake provider and through prefit alternately; ms, p50 / p99; 'added' is the "
        "per-turn difference.\n"
    )
    print(
        "| conversation tokens | messages | prefit's fit | sent tokens | direct | through "
        "prefit | added | prefit's own (server) | API CPU ms / request | stream: first byte "
        "direct | through prefit | added | stream: end, added |"
    )
    print("|" + " --- |" * 13)
    for r in rows:
        h, plain, streamed = r["headers"], r[False], r[True]
        fit = h.get("x-prefit-fit", "?")
        if "x-prefit-summary-upto" in h:
            fit += f", summary@{h['x-prefit-summary-upto']}"
        sent = int(h.get("x-prefit-tokens-after", 0))
        print(
            f"| {r['size']:,} | {r['messages']} | {fit} | {sent:,} "
            f"| {pair(plain['d_end'])} | {pair(plain['p_end'])} | {pair(added(plain, 'end'))} "
            f"| {pair(r[('own', False)])} | {r[('cpu', False)]:.1f} "
            f"| {pair(streamed['d_first'])} | {pair(streamed['p_first'])} "
            f"| {pair(added(streamed, 'first'))} | {pair(added(streamed, 'end'))} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8000,32000,128000,512000")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between turns (think time)")
    server_options(ap)
    args = ap.parse_args()
    with RedisProcess() as redis, tempfile.TemporaryDirectory() as tmp:
        settings = bench_settings(redis.url)
        store = Store.from_url(redis.url, settings)
        fake, fake_url = start_fake(Path(tmp) / "fake.log")
        log = Path(tmp) / "api.log"
        try:
            api, api_url = start_proxy(redis.url, fake_url, log, args)
        except BaseException:
            fake.terminate()
            raise
        try:
            direct, proxied = f"{fake_url}/v1/chat/completions", f"{api_url}/v1/chat/completions"
            rows = [
                measure(
                    direct,
                    proxied,
                    store,
                    settings,
                    int(size),
                    args.turns,
                    args.pause,
                    log,
                    api.pid,
                )
                for size in args.sizes.split(",")
            ]
        finally:
            for proc in (api, fake):
                proc.terminate()
                proc.wait(10)
            store.close()
    print_table(rows, args.turns, args.pause)
    root = "this checkout" if args.server_root == ROOT else str(args.server_root)
    print(f"\nAPI from {root} {args.uvicorn_args}; load average {load_average()}")


if __name__ == "__main__":
    main()
