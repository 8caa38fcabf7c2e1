"""Replay real transcripts turn by turn: prefit's prepare against langchain-core's trim_messages.

Both get the same inputs (the transcript as a client would resend it on every turn), the same
token counter object (with its content-keyed cache) and the same budget. langchain works on
its own message classes, so its token counter converts each message back to an OpenAI dict
first: that conversion is part of what using it costs.

    uv run python -m bench.prepare_vs_trim [--window 128000] [--every 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages, trim_messages

from shared.counters import HeuristicCounter, TiktokenCounter, TokenCounter
from shared.messages import Message, groups, head_end
from shared.policy import ContextPolicy
from tests.conftest import TIKTOKEN_DIR, load_transcript, transcript_files

SIZES = (250, 500, 750, 1000)


def long_session(target: int = 1000) -> list[Message]:
    """One long agent session: the real coding-agent transcripts, one task after another."""
    files = sorted(
        (p for p in transcript_files() if p.name.startswith("mswea")), key=lambda p: p.name
    )
    out: list[Message] = []
    for path in files:
        msgs = load_transcript(path)["messages"]
        out.extend(msgs if not out else msgs[head_end(msgs, keep_first_user=False) :])
        if len(out) >= target:
            break
    cut = max(b for _, b in groups(out) if b <= target)
    return out[:cut]


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def replay(
    msgs: list[Message], counter: TokenCounter, window: int, every: int
) -> dict[str, list[tuple[int, float]]]:
    """ms per call for both, at every `every`-th turn boundary."""
    policy = ContextPolicy(window, counter=counter)
    budget = policy.budget(None)

    def lc_count(batch: list[BaseMessage]) -> int:
        return sum(counter.count_message(m) for m in convert_to_openai_messages(batch))

    out: dict[str, list[tuple[int, float]]] = {"prefit": [], "trim_messages": []}
    loop = asyncio.new_event_loop()
    ends = [b for _, b in groups(msgs)][::every]
    trim = partial(
        trim_messages,
        max_tokens=budget,
        token_counter=lc_count,
        strategy="last",
        include_system=True,
        start_on="human",
    )
    for end in ends:
        turn = msgs[:end]
        out["prefit"].append((end, _time(partial(loop.run_until_complete, policy.prepare(turn)))))
        out["trim_messages"].append((end, _time(partial(trim, turn))))
    loop.close()
    return out


def _at(points: list[tuple[int, float]], size: int) -> float:
    near = [ms for n, ms in points if size - 60 < n <= size]
    return statistics.median(near) if near else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=int, default=128_000)
    parser.add_argument("--every", type=int, default=3)
    args = parser.parse_args()
    session = long_session()
    counters: dict[str, Callable[[], TokenCounter]] = {"heuristic": HeuristicCounter}
    if (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file():
        counters["tiktoken"] = lambda: TiktokenCounter(directory=TIKTOKEN_DIR)
    print(f"session: {len(session)} messages from real transcripts; window {args.window}")
    print("| counter | messages | prefit ms/call | trim_messages ms/call | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name, make in counters.items():
        result = replay(session, make(), args.window, args.every)
        for size in SIZES:
            ours, theirs = _at(result["prefit"], size), _at(result["trim_messages"], size)
            print(f"| {name} | {size} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.0f}x |")


if __name__ == "__main__":
    main()
