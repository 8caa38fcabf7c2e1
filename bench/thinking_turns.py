"""Tool loops with extended thinking, replayed turn by turn: what a strict Anthropic upstream
would refuse of the prompts prefit makes, and whether the person's latest request survives.

The real transcripts carry no thinking blocks, so each gets them the way extended thinking
writes them: a thinking block at the start of the first assistant message after every
user message (a request of the person, or another user turn), the loop's later steps
without one (interleaved thinking off: the case of issue 23), and Claude Code's
`<system-reminder>` after the tool results of every third step, the step after it
thinking again (a user turn that is not only tool results opens a turn, to the strict
fake provider). Those that have an Anthropic form (`to_anthropic`) are read back as the
Anthropic dialect reads them, prepared after every turn group at 8k, 16k and 32k windows
with the default strategies, and each prompt is sent to Anthropic's rule
(tests/shared/invariants.py, `thinking_refusal`: every assistant message after a user
message that is not only tool results starts with its thinking block); a prefix the rule
refuses as the client sent it is counted apart (`refused as sent`). Long synthetic
sessions (tests/shared/generated.py, `thinking_sessions`, fixed seeds) are replayed the
same way.

With `--proxy`, the same sessions go through the proxy instead (real uvicorn, a throwaway
Redis) to tests/fakeprovider.py, strict: one Anthropic Messages request per assistant reply,
holding every message before it, with `thinking: {"type": "enabled"}` and `max_tokens:
2048` (a thinking budget of 1,024), answered at once (`AT_ONCE`); counted are the
requests, those the client got a non-2xx for, and the fake's refusals by a rule of the
provider (`rule`), the thinking rule's among them.

    uv run python -m bench.thinking_turns [--every 1] [--sessions 40] [--proxy]
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from api.app import create_app
from shared.commands.redisproc import RedisProcess
from shared.counting.counters import HeuristicCounter
from shared.errors import DoesNotFit, InvalidTranscript
from shared.formats.anthropic import from_anthropic, to_anthropic
from shared.logs import configure_logging
from shared.messages import Message, groups, is_request
from shared.policy import ContextPolicy
from shared.settings import ModelWindow, Settings
from shared.store import Store
from shared.strategies.drop import PIN_MAX_SHARE
from shared.strategies.lastresort import REQUEST_NAME
from tests.api.conftest import Recorder
from tests.api.server import serve
from tests.conftest import load_transcript, transcript_files
from tests.fakeprovider import AT_ONCE, FakeProvider
from tests.shared.generated import REMINDER, thinking_sessions
from tests.shared.invariants import thinking_refusal

WINDOWS = (8_000, 16_000, 32_000)
COUNTER = HeuristicCounter()
THINKING = {
    "type": "thinking",
    "thinking": "Let me think about this step. " * 20,
    "signature": "Eq",
}


def with_thinking(msgs: Sequence[Message]) -> list[Message] | None:
    """`msgs` as a Claude session with extended thinking sends them (see the module
    docstring), read back by the Anthropic dialect; None when they have no Anthropic form."""
    out: list[Message] = []
    opened = False
    for m in msgs:
        if m.get("role") == "user":  # a request, or any user turn the strict reading counts
            opened = True
        if m.get("role") == "assistant" and opened:
            content = m.get("content")
            parts = (
                [{"type": "text", "text": content}] if isinstance(content, str) and content else []
            )
            parts = list(content) if isinstance(content, list) else parts
            m = {**m, "content": [dict(THINKING), *parts]}
            opened = False
        out.append(m)
    try:
        system, sent = to_anthropic(out)
    except InvalidTranscript:
        return None
    step, reminded = 0, False
    for m in sent:
        content = m["content"]
        if reminded and m["role"] == "assistant" and isinstance(content, list):
            m["content"] = [dict(THINKING), *content]  # the step after a reminder thinks again
        reminded = False
        if (
            m["role"] == "user"
            and isinstance(content, list)
            and content[0]["type"] == "tool_result"
        ):
            step += 1
            if step % 3 == 0:
                content.append({"type": "text", "text": REMINDER})
                reminded = True
    return from_anthropic(system, sent)


async def replay(msgs: list[Message], window: int, every: int, tally: dict[str, int]) -> None:
    """Prepare `msgs` after every `every`-th turn group, checking each prompt."""
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=1024)
    ends = [b for _, b in groups(msgs)][::every]
    for end in ends:
        prefix = msgs[:end]
        tally["prompts"] += 1
        if thinking_refusal(to_anthropic(prefix)[1]) is not None:
            tally["refused as sent"] += 1  # the client's own request: not prefit's doing
            continue
        try:
            out = await policy.prepare(prefix, conversation="bench")
        except DoesNotFit:
            tally["does not fit"] += 1
            continue
        assert out.report is not None
        tally["cut"] += bool(out.report["changed"])
        tally["refused by Anthropic"] += thinking_refusal(to_anthropic(out.messages)[1]) is not None
        last = max((i for i, m in enumerate(prefix) if is_request(m)), default=None)
        if last is None or prefix[last] in out.messages or out.report["summary"] is not None:
            continue
        shed = any(a["strategy"] == REQUEST_NAME for a in out.report["applied"])
        small = COUNTER.count_message(prefix[last]) <= PIN_MAX_SHARE * out.report["target_tokens"]
        tally["latest request lost" if small and not shed else "latest request shed"] += 1


def synthetic(n: int) -> list[list[Message]]:
    """`n` long thinking sessions, the same ones every run."""
    found: list[list[Message]] = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(thinking_sessions(max_turns=8), st.just(None))
    def collect(session: tuple[Any, list[dict[str, Any]]], _: None) -> None:
        found.append(from_anthropic(*session))

    collect()
    return found[:n]


@contextmanager
def proxy(redis_url: str, fake: FakeProvider) -> Iterator[str]:
    """The API in front of `fake`, one model per window (reserve 1,024)."""
    models = {f"bench-{w}": ModelWindow(max_input_tokens=w, reserve_output=1024) for w in WINDOWS}
    with serve(fake.app) as fake_url:
        settings = Settings(
            redis_url=redis_url,
            models=models,
            anthropic_base_url=fake_url,
            anthropic_api_key=SecretStr("sk-bench"),
            request_deadline_s=10.0,  # a loaded bench machine is not what this measures
        )
        store = Store.from_url(redis_url, settings)
        try:
            with serve(create_app(settings, store=store, enqueue=Recorder())) as url:
                yield url
        finally:
            store.close()


def through_proxy(
    url: str, fake: FakeProvider, corpus: list[list[Message]], window: int
) -> Counter[str]:
    """Every session's turns, each request as Claude Code sends it with thinking on."""
    out: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=120) as client:
        for number, msgs in enumerate(corpus):
            ends = [k for k in range(1, len(msgs)) if msgs[k]["role"] == "assistant"]
            for end in ends:
                system, sent = to_anthropic(msgs[:end])
                body: dict[str, Any] = {
                    "model": f"bench-{window}",
                    "messages": sent,
                    "max_tokens": 2048,
                    "thinking": {"type": "enabled", "budget_tokens": 1024},
                }
                if system:
                    body["system"] = system
                seen = len(fake.received)
                r = client.post(
                    "/v1/messages",
                    json=body,
                    headers={
                        "anthropic-version": "2023-06-01",
                        "x-prefit-conversation": f"t{window}-{number}-{id(corpus)}",
                    },
                )
                got = fake.received[seen:]
                errors = [str(getattr(g, "error", "")) for g in got if g.status == 400]
                out["requests"] += 1
                out["rejected"] += r.status_code >= 300
                out["rule"] += sum(1 for e in errors if "context" not in e and "too long" not in e)
                out["thinking rule"] += sum(1 for e in errors if "thinking" in e)
    return out


async def main(every: int, sessions: int) -> None:
    real = [with_thinking(load_transcript(p)["messages"]) for p in transcript_files()]
    usable = [m for m in real if m is not None]
    print(f"{len(usable)} of {len(real)} real transcripts have an Anthropic form")
    for name, corpus in (("real", usable), ("synthetic", synthetic(sessions))):
        for window in WINDOWS:
            tally = dict.fromkeys(
                (
                    "prompts",
                    "refused as sent",
                    "cut",
                    "does not fit",
                    "refused by Anthropic",
                    "latest request lost",
                    "latest request shed",
                ),
                0,
            )
            for msgs in corpus:
                await replay(msgs, window, every, tally)
            print(name, window, tally)


def main_proxy(sessions: int) -> None:
    configure_logging(json=False, level="ERROR")
    real = [with_thinking(load_transcript(p)["messages"]) for p in transcript_files()]
    corpora = (("real", [m for m in real if m is not None]), ("synthetic", synthetic(sessions)))
    redis = RedisProcess().start()
    try:
        for window in WINDOWS:
            fake = FakeProvider(limit_tokens=window, pace=AT_ONCE)
            with proxy(redis.url, fake) as url:
                for name, corpus in corpora:
                    print(name, window, dict(through_proxy(url, fake, corpus, window)), flush=True)
    finally:
        redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--proxy", action="store_true")
    args = parser.parse_args()
    if args.proxy:
        main_proxy(args.sessions)
    else:
        asyncio.run(main(args.every, args.sessions))
