"""Real transcripts replayed through the proxy against the strict fake provider: what it
rejects, and how many first attempts overflow, with and without learning from overflows.

Each real transcript (/work/shared/transcripts) is replayed turn by turn, the way an agent
resends it: one request per assistant reply, holding every message before it, in each of
the three APIs' shapes (Chat Completions with `max_completion_tokens: 1024`, Anthropic
Messages with `max_tokens: 64000` as the Vercel AI SDK, LangChain and pydantic-ai send for
claude-sonnet-4-5, Responses with `max_output_tokens: 4096`), for models of 8k, 16k and 32k
windows (reserve 1,024). The provider is tests/fakeprovider.py, strict: it refuses what the
providers refuse with their messages, and counts the prompt with a real tokenizer
(o200k_base, times `--density`, 1.2 by default: a provider's tokenizer is not prefit's
heuristic), so prefit's estimates are off the way they are against a real provider, more
on some conversations (code, JSON) than on others.

Counted per window and shape: the requests; those the client got a non-2xx for (`rejected`:
the provider's rule refusals and overflows that reached the client, and prefit's own
refusals of prompts that cannot fit with the reply floor); the fake's rule refusals
(`rule`); the first attempts the provider refused as over the window (`first over`), each a
round trip the client waited for; and the replies prefit lowered. Run twice: with the
per-conversation corrections learned from overflows (`api/proxy/overflow.py`,
`Corrections`) and with them off (`--no-learning` alone, or both by default).

    uv run python -m bench.overflows [--files 26] [--turns 40] [--windows 8000,16000,32000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from api.app import create_app
from api.proxy.overflow import Corrections
from shared.commands.redisproc import RedisProcess
from shared.counting.counters import TiktokenCounter
from shared.formats import to_anthropic
from shared.formats.anthropic import tools_to_anthropic
from shared.logs import configure_logging
from shared.messages import Message, ToolSpec
from shared.settings import ModelWindow, Settings
from shared.store import Store
from tests.api.conftest import Recorder
from tests.api.server import serve
from tests.conftest import TIKTOKEN_DIR, load_transcript, transcript_files
from tests.fakeprovider import AT_ONCE, FakeProvider

SHAPES = ("chat", "anthropic", "responses")
RESERVE = 1_024


class Unlearned(Corrections):
    """Corrections that never learn: the proxy as it was before them."""

    def pressure(self, tenant: str, conversation: str) -> float:
        return 1.0


class DenserCounter:
    """A provider's tokenizer: o200k_base's count times `density`."""

    def __init__(self, density: float) -> None:
        self.base = TiktokenCounter("o200k_base", directory=TIKTOKEN_DIR)
        self.density = density

    def count(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> float:
        return self.base.count(messages, tools or []) * self.density


def responses_input(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items) of OpenAI-format messages, as a Responses client sends."""
    instructions = None
    items: list[dict[str, Any]] = []
    for k, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        text = content if isinstance(content, str) else json.dumps(content or "")
        if role in ("system", "developer") and k == 0:
            instructions = text
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": m["tool_call_id"], "output": text}
            )
        elif role == "assistant":
            if text:
                items.append({"role": "assistant", "content": text})
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": fn["name"],
                        "arguments": fn.get("arguments") or "{}",
                    }
                )
        else:
            items.append({"role": role if role != "system" else "developer", "content": text})
    return instructions, items


def request(
    shape: str, model: str, messages: list[Message], tools: list[ToolSpec]
) -> tuple[str, dict[str, Any]]:
    """(path, body) of one turn's request in `shape`."""
    if shape == "chat":
        body: dict[str, Any] = {"model": model, "messages": messages, "max_completion_tokens": 1024}
        return "/v1/chat/completions", body | ({"tools": tools} if tools else {})
    if shape == "anthropic":
        system, converted = to_anthropic(messages)
        body = {"model": model, "messages": converted, "max_tokens": 64_000}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = tools_to_anthropic(tools)
        return "/v1/messages", body
    instructions, items = responses_input(messages)
    body = {"model": model, "input": items, "max_output_tokens": 4096, "store": False}
    if instructions:
        body["instructions"] = instructions
    return "/v1/responses", body


def turns(messages: list[Message], limit: int) -> list[int]:
    """The prefix lengths an agent sends: each ends right before an assistant reply."""
    ends = [k for k in range(1, len(messages)) if messages[k]["role"] == "assistant"]
    return ends[:limit]


@contextmanager
def proxy(redis_url: str, windows: list[int], fake: FakeProvider, learning: bool) -> Iterator[str]:
    """The API (real uvicorn, real Redis) in front of `fake`, one model per window."""
    models = {
        f"bench-{w}": ModelWindow(max_input_tokens=w, reserve_output=RESERVE) for w in windows
    }
    with serve(fake.app) as fake_url:
        settings = Settings(
            redis_url=redis_url,
            models=models,
            openai_base_url=f"{fake_url}/v1",
            openai_api_key=SecretStr("sk-bench"),
            anthropic_base_url=fake_url,
            anthropic_api_key=SecretStr("sk-bench"),
            request_deadline_s=10.0,  # a loaded bench machine is not what this measures
        )
        store = Store.from_url(redis_url, settings)
        app = create_app(settings, store=store, enqueue=Recorder())
        if not learning:
            app.state.proxy = replace(app.state.proxy, corrections=Unlearned())
        try:
            with serve(app) as url:
                yield url
        finally:
            store.close()


def replay(
    url: str, fake: FakeProvider, files: list[Path], window: int, shape: str, limit: int, tag: str
) -> Counter[str]:
    """Every file's turns in `shape` for the `window` model; the counts."""
    out: Counter[str] = Counter()
    model = f"bench-{window}"
    headers = {"anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=url, timeout=120) as client:
        for number, path in enumerate(files):
            data = load_transcript(path)
            messages, tools = data["messages"], data.get("tools") or []
            conversation = f"{tag}-{number}-{shape}-{window}"
            for end in turns(messages, limit):
                try:
                    route, body = request(shape, model, messages[:end], tools)
                except Exception:  # a prefix Anthropic's form cannot express: not a turn
                    out["unsendable"] += 1
                    continue
                seen = len(fake.received)
                r = client.post(
                    route, json=body, headers={**headers, "x-prefit-conversation": conversation}
                )
                got = fake.received[seen:]
                out["requests"] += 1
                out["rejected"] += r.status_code >= 300
                out["refused by prefit"] += r.status_code == 400 and "prefit:" in r.text
                out["rule"] += sum(1 for g in got if g.status == 400 and not _overflow(g.error))
                out["first over"] += bool(got) and _overflow(got[0].error)
                out["retried"] += int(r.headers.get("x-prefit-retries", "0")) > 0
                out["lowered"] += "x-prefit-max-tokens" in r.headers
                if r.status_code >= 300 and out["examples"] < 3:
                    out["examples"] += 1
                    print(
                        f"  {path.stem} {shape} {window} turn {end}: {r.status_code} {r.text[:200]}"
                    )
    return out


def _overflow(error: str) -> bool:
    return "context" in error or "too long" in error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--files", type=int, default=26, help="transcripts replayed (spread over the sources)"
    )
    parser.add_argument("--turns", type=int, default=40, help="turns replayed per transcript")
    parser.add_argument("--windows", default="8000,16000,32000")
    parser.add_argument("--density", type=float, default=1.2)
    parser.add_argument("--no-learning", action="store_true", help="only without corrections")
    parser.add_argument("--learning", action="store_true", help="only with corrections")
    args = parser.parse_args(argv)
    configure_logging(json=False, level="ERROR")
    windows = [int(w) for w in args.windows.split(",")]
    every = transcript_files()
    files = every[:: max(1, len(every) // args.files)][: args.files]  # each source's share
    modes = [False] if args.no_learning else [True] if args.learning else [False, True]
    fields = ("requests", "rejected", "refused by prefit", "rule", "first over", "retried")
    for learning in modes:
        name = "with corrections" if learning else "without corrections"
        redis = RedisProcess().start()  # each mode calibrates from nothing
        try:
            for window in windows:
                counter = DenserCounter(args.density)
                fake = FakeProvider(limit_tokens=window, pace=AT_ONCE, counter=counter)
                with proxy(redis.url, windows, fake, learning) as url:
                    for shape in SHAPES:
                        started = time.monotonic()
                        tag = f"{'l' if learning else 'n'}{time.time_ns()}"
                        got = replay(url, fake, files, window, shape, args.turns, tag)
                        took = time.monotonic() - started
                        line = " ".join(f"{k}={got[k]}" for k in (*fields, "lowered"))
                        print(f"{name:21} {window:>6} {shape:9} {line} ({took:.0f} s)", flush=True)
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
