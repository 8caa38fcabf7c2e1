"""Compaction answered by prefit: `POST /v1/responses/compact` with a summary made ahead.

    uv run python -m bench.compaction [--sizes 128000,512000] [--calls 200]

Starts its own redis-server, the fake provider without OpenAI's compaction (`python -m
tests.fakeprovider --no-compaction`: its `/v1/responses/compact` is a 404, as on vLLM or
Ollama) and the API (`uvicorn api.app:app`, one process, open mode). For each size it sends
one coding-agent session (real transcripts stitched end to end, as Responses input items)
to `POST /v1/responses`, lets the workers' job write its summary record
(`shared.service.precompute.run_job`, offline extractive summarizer), then times `--calls`
compactions of that transcript (the SDK's `client.responses.compact` body, keep-alive), each
answered `x-prefit-compaction: summary` by prefit, and the next turn sent with the compacted
output (the summary expanded in the item's place). Goal: < 50 ms at p50. "Own" is the
latency prefit's request log gives (body read to answer sent, not the client's sending of
the body). Prints a markdown table; asserts only that every compaction was answered from
the summary.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import (
    MODEL,
    bench_settings,
    completed,
    load_average,
    pct,
    start_api,
    stitched,
    stop,
    wait_up,
)
from bench.proxy_overhead import summarize
from shared.commands.redisproc import RedisProcess, free_port
from shared.formats.responses import from_responses, to_responses
from shared.settings import Settings
from shared.store import Store

JSON = {"content-type": "application/json"}
INSTRUCTIONS = "You are a coding agent. Work step by step."


def start_fake(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakeprovider", "--port", str(port), "--no-compaction"]
    proc = subprocess.Popen(argv, stderr=log.open("wb"), stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_up(f"{url}/v1/models", proc, "the fake provider")
    return proc, url


def one_size(
    client: httpx.Client,
    url: str,
    store: Store,
    settings: Settings,
    log: Path,
    tokens: int,
    calls: int,
) -> dict[str, Any]:
    """One session of about `tokens` tokens: summarized, compacted `calls` times, resumed."""
    items = to_responses(stitched(tokens))
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": items}
    first = client.post(f"{url}/v1/responses", content=orjson.dumps(body), headers=JSON)
    assert first.status_code == 200, first.text
    conv = first.headers["x-prefit-conversation"]
    length = len(from_responses(INSTRUCTIONS, items))
    status = summarize(store, settings, conv, length)
    assert status == "written", status
    raw = orjson.dumps(body)
    times: list[float] = []
    answer = None
    offset = 0
    for k in range(calls + 5):  # the first few warm the caches up, as any turn does
        if k == 5:
            offset = log.stat().st_size
        started = time.perf_counter()
        r = client.post(f"{url}/v1/responses/compact", content=raw, headers=JSON)
        took = (time.perf_counter() - started) * 1000
        assert r.status_code == 200 and r.headers["x-prefit-compaction"] == "summary", r.text
        if k >= 5:
            times.append(took)
        answer = r
    own = [
        float(e["latency_ms"])
        for e in completed(log, offset)
        if e.get("route") == "/v1/responses/compact"
    ]
    assert answer is not None
    output = answer.json()["output"]
    after = {**body, "input": [*output, {"role": "user", "content": "continue"}]}
    started = time.perf_counter()
    nxt = client.post(f"{url}/v1/responses", content=orjson.dumps(after), headers=JSON)
    next_ms = (time.perf_counter() - started) * 1000
    assert nxt.status_code == 200 and nxt.headers["x-prefit-compaction"] == "expanded"
    return {
        "tokens": tokens,
        "body_mb": len(raw) / 1e6,
        "items": len(items),
        "kept": len(output),
        "before": int(answer.headers["x-prefit-tokens-before"]),
        "after": int(answer.headers["x-prefit-tokens-after"]),
        "p50": pct(times, 50),
        "p99": pct(times, 99),
        "own50": pct(own, 50),
        "own99": pct(own, 99),
        "next": next_ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="128000,512000")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    redis = RedisProcess()
    redis_url = redis.start().url
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fake, fake_url = start_fake(tmp / "fake.log")
        procs.append(fake)
        # the first turn of a 2 MB session is read, hashed and counted from nothing
        env = {"PREFIT_OPENAI_BASE_URL": f"{fake_url}/v1", "PREFIT_REQUEST_DEADLINE_S": "10"}
        api, url = start_api(redis_url, tmp / "api.log", extra_env=env)
        procs.append(api)
        settings = bench_settings(redis_url)
        store = Store.from_url(redis_url, settings)
        rows = []
        with httpx.Client(timeout=60) as client:
            for size in (int(s) for s in args.sizes.split(",")):
                rows.append(
                    one_size(client, url, store, settings, tmp / "api.log", size, args.calls)
                )
        print(f"compaction with a summary made ahead, {args.calls} calls, load {load_average()}")
        print(
            "| tokens | body | items -> kept | tokens before -> after | p50 / p99 | "
            "prefit's own p50 / p99 | next turn |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(
                f"| {r['tokens']:,} | {r['body_mb']:.1f} MB | {r['items']} -> {r['kept']} | "
                f"{r['before']:,} -> {r['after']:,} | {r['p50']:.1f} / {r['p99']:.1f} ms | "
                f"{r['own50']:.1f} / {r['own99']:.1f} ms | {r['next']:.0f} ms |"
            )
    finally:
        for proc in procs:
            stop(proc)
        redis.stop()


if __name__ == "__main__":
    main()
