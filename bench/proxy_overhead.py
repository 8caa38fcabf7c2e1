"""Proxy overhead: the latency prefit adds in front of a provider, at 8k to 512k tokens.

    uv run python -m bench.proxy_overhead [--sizes 8000,32000,128000,512000] [--turns 100]
        [--dialect chat|anthropic]

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

`--dialect anthropic` plays the same conversations as Claude Code sends them to
`POST /v1/messages` (`PREFIT_ANTHROPIC_BASE_URL` at the fake): `system` as text blocks with
`cache_control`, tool calls and results as `tool_use` / `tool_result` blocks, its tool
definitions, `metadata.user_id` naming the session, `max_tokens` 32000, and the
`cache_control` marker on the last message's last block, moved to the new last message
each turn (so the previous last message changes too, as Claude Code's does).
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
from shared.formats import from_anthropic, to_anthropic
from shared.messages import Message
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.settings import Settings
from shared.store import Store
from shared.summaries.extractive import ExtractiveSummarizer

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
    """The API (as bench/api_latency.py starts it) forwarding requests to the fake."""
    env = {"PREFIT_OPENAI_BASE_URL": f"{fake_url}/v1", "PREFIT_ANTHROPIC_BASE_URL": fake_url}
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
    """`n` Chat Completions request bodies: the transcript grown by one exchange per turn."""
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


# --- Claude Code's shape ------------------------------------------------------------------------

SESSION = "0b5e8c1d-4f6a-4e2b-9c7d-3a1f2e4d5c6b"
USER_ID = f"user_{'ab' * 32}_account__session_{SESSION}"
EPHEMERAL = {"type": "ephemeral"}
CLAUDE_TOOLS = ("Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "WebFetch", "TodoWrite")


def claude_tools() -> list[dict[str, Any]]:
    """Tool definitions the size of Claude Code's (a few kB of description each)."""
    schema = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "What to run. " * 20}},
        "required": ["command"],
        "additionalProperties": False,
    }
    return [
        {
            "name": name,
            "description": f"{name}: " + "How to use this tool well. " * 120,
            "input_schema": schema,
        }
        for name in CLAUDE_TOOLS
    ]


def claude_session(transcript: list[Message]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(system blocks, messages) of `transcript` as Claude Code sends it: its system prompt
    as text blocks marked `cache_control`, the rest converted, ending on a user message."""
    system, messages = to_anthropic(transcript)
    text = system if isinstance(system, str) else json.dumps(system)
    blocks = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.0; cc_entrypoint=cli"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
        {"type": "text", "text": text or "bench", "cache_control": EPHEMERAL},
    ]
    if messages and messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "Go on."})
    return blocks, messages


def marked(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with `cache_control` on its last block (a string becomes a text block)."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return {**message, "content": [*blocks[:-1], {**blocks[-1], "cache_control": EPHEMERAL}]}


def claude_turns(transcript: list[Message], n: int, stream: bool) -> list[bytes]:
    """`n` Messages request bodies as Claude Code sends them, grown by one tool round per
    turn; the `cache_control` marker is on the last message only."""
    system, messages = claude_session(transcript)
    tools, out = claude_tools(), []
    for k in range(n):
        body = {
            "model": MODEL,
            "messages": [*messages[:-1], marked(messages[-1])],
            "temperature": 1,
            "system": system,
            "tools": tools,
            "metadata": {"user_id": USER_ID},
            "max_tokens": 32000,
            "stream": stream,
        }
        out.append(json.dumps(body).encode())
        call = f"toolu_bench_{k:04d}"
        use = {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": f"ls {k}"}}
        result = {"type": "tool_result", "tool_use_id": call, "content": f"file_{k}.py\n" * 8}
        messages = [
            *messages,
            {"role": "assistant", "content": [{"type": "text", "text": f"Step {k}."}, use]},
            {"role": "user", "content": [result]},
        ]
    return out


def stored_length(body: bytes) -> int:
    """How many messages prefit stores for one Messages request body."""
    value = json.loads(body)
    return len(from_anthropic(value["system"], value["messages"]))


DIALECTS = {  # (path, request bodies, stored messages of the first)
    "chat": ("/v1/chat/completions", turns, None),
    "anthropic": ("/v1/messages", claude_turns, stored_length),
}


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
    dialect: str = "chat",
) -> dict[str, Any]:
    transcript = stitched(size)
    _, bodies, stored = DIALECTS[dialect]
    seen: dict[str, str] = {}

    def first_turn(headers: httpx.Headers) -> None:
        seen.update({k: v for k, v in headers.items() if k.startswith("x-prefit-")})

    # warm: store the conversation, make its summary, fill the API's caches
    warm = bodies(transcript, 2, False)
    play(direct, proxied, warm[:1], first_turn)
    length = len(transcript) if stored is None else stored(warm[0])
    status = summarize(store, settings, seen["x-prefit-conversation"], length)
    play(direct, proxied, warm[1:], lambda h: None)
    row: dict[str, Any] = {"size": size, "messages": len(transcript), "summary": status}
    after: dict[str, str] = {}
    for stream in (False, True):
        after.clear()
        offset, cpu = log.stat().st_size, cpu_seconds(pid)
        got = play(direct, proxied, bodies(transcript, n, stream), after.update, pause)
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
    ap.add_argument("--dialect", choices=sorted(DIALECTS), default="chat", help="the API played")
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
            path = DIALECTS[args.dialect][0]
            direct, proxied = f"{fake_url}{path}", f"{api_url}{path}"
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
                    args.dialect,
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
    print(f"\n{args.dialect}; API from {root} {args.uvicorn_args}; load average {load_average()}")


if __name__ == "__main__":
    main()
