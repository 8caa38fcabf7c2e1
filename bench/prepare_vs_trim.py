"""Replay real transcripts turn by turn: prefit's prepare against langchain-core's trim_messages.

Both get the same inputs (the transcript as a client would resend it on every turn), the same
token counter object (with its content-keyed cache) and the same budget. langchain works on
its own message classes, so its token counter converts each message back to an OpenAI dict
first: that conversion is part of what using it costs.

Counting a message for the first time is a cost any method pays once, and with one shared
counter whoever runs first would pay it for both. So every message of the session is counted
once before anything is timed, and each method replays the session in a pass of its own, as
`timeit` would run it (garbage collector paused during each call). Two more runs show what
this leaves out: each method again with a 10 ms pause before every call (on this VM even a
pause of a few ms leaves the CPU caches cold), and prefit with a counter of its own that
counts each new message in the call.

    uv run python -m bench.prepare_vs_trim [--window 128000] [--every 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages, trim_messages

from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.messages import Message, groups
from shared.policy import ContextPolicy
from tests.conftest import TIKTOKEN_DIR, long_session

SIZES = (250, 500, 750, 1000)


def _time(fn: Callable[[], Any]) -> float:
    """ms one call takes, with the garbage collector paused as `timeit` does: a collection
    due to one contender's garbage would otherwise land in whichever call runs next."""
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000
    finally:
        gc.enable()


def replay(
    msgs: list[Message], make: Callable[[], TokenCounter], window: int, every: int
) -> dict[str, list[tuple[int, float]]]:
    """ms per call at every `every`-th turn boundary, for each way of running (see main)."""
    counter = make()
    counter.count(msgs)  # every message counted once, ahead: see the module's docstring
    budget = ContextPolicy(window).budget(None)

    def lc_count(batch: list[BaseMessage]) -> int:
        return sum(counter.count_message(m) for m in convert_to_openai_messages(batch))

    trim = partial(
        trim_messages,
        max_tokens=budget,
        token_counter=lc_count,
        strategy="last",
        include_system=True,
        start_on="human",
    )
    loop = asyncio.new_event_loop()

    def ours(policy: ContextPolicy) -> Callable[[list[Message]], Any]:
        return lambda turn: loop.run_until_complete(policy.prepare(turn))

    turns = [msgs[:b] for _, b in groups(msgs)][::every]
    out = {
        "prefit": _pass(turns, ours(ContextPolicy(window, counter=counter))),
        "trim_messages": _pass(turns, trim),
        "cold": _pass(turns, ours(ContextPolicy(window, counter=make()))),
    }
    out["prefit, paused"] = _pass(turns, ours(ContextPolicy(window, counter=counter)), pause=0.01)
    out["trim_messages, paused"] = _pass(turns, trim, pause=0.01)
    loop.close()
    return out


def _pass(
    turns: list[list[Message]], call: Callable[[list[Message]], Any], pause: float = 0.0
) -> list[tuple[int, float]]:
    """(messages, ms) of `call` on each turn, each call `pause` s after the last (not timed)."""
    out = []
    for turn in turns:
        if pause:
            time.sleep(pause)
        out.append((len(turn), _time(partial(call, turn))))
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
    results = {
        name: replay(session, make, args.window, args.every) for name, make in counters.items()
    }
    print("| counter | messages | prefit ms/call | trim_messages ms/call | speed-up |")
    print("|---|---:|---:|---:|---:|")
    _table(results, "prefit", "trim_messages")
    print("\nEach call 10 ms after the previous one (CPU caches no longer hold its data):\n")
    print("| counter | messages | prefit ms/call | trim_messages ms/call | speed-up |")
    print("|---|---:|---:|---:|---:|")
    _table(results, "prefit, paused", "trim_messages, paused")
    print("\nprefit with a counter of its own, new messages first counted in the call:\n")
    print("| counter | messages | prefit ms/call |")
    print("|---|---:|---:|")
    for name, result in results.items():
        for size in SIZES:
            print(f"| {name} | {size} | {_at(result['cold'], size):.2f} |")


def _table(results: dict[str, dict[str, list[tuple[int, float]]]], a: str, b: str) -> None:
    for name, result in results.items():
        for size in SIZES:
            ours, theirs = _at(result[a], size), _at(result[b], size)
            print(f"| {name} | {size} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.0f}x |")


if __name__ == "__main__":
    main()
