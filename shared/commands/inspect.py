"""`prefit inspect`: show a person what prepare does to a transcript, one cell per turn group."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

from shared.commands.demo import load_conversation
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.errors import ConfigError, PrefitError
from shared.messages import Message, groups
from shared.policy import ContextPolicy
from shared.settings import Settings
from shared.strategies import Work
from shared.strategies.clear import PLACEHOLDER
from shared.strategies.lastresort import shed_kept, shorten_protected
from shared.summaries.book import SummaryBook
from shared.summaries.extractive import ExtractiveSummarizer

STYLE = {  # fate: (cell, ANSI colour)
    "head": ("█", "1;37"),
    "kept": ("█", "32"),
    "shortened": ("▓", "33"),
    "cleared": ("▒", "36"),
    "summarized": ("▚", "35"),
    "dropped": ("░", "31"),
}


def fates(transcript: list[Message], work: Work) -> list[tuple[int, int, str]]:
    """(start, end, fate) of every original turn group (the head as one or two cells)."""
    work.align()
    now = {o: m for m, o in zip(work.messages, work.origin, strict=True) if o >= 0}
    upto = work.summary.upto if work.summary else 0
    head = work.head
    out: list[tuple[int, int, str]] = []
    at = 0  # the gap and the template may be cut: they get cells of their own
    for lo, hi in head.cuts:
        out += [(at, lo, "head")] if lo > at else []
        out += [(a, b, _fate(transcript, now, a, b, upto)) for a, b in groups(transcript[:hi], lo)]
        at = hi
    out += [(at, head.end, "head")] if head.end > at else []
    out += [(a, b, _fate(transcript, now, a, b, upto)) for a, b in groups(transcript, head.end)]
    return out


def _fate(transcript: list[Message], now: dict[int, Message], a: int, b: int, upto: int) -> str:
    kept = [now.get(i) for i in range(a, b)]
    if all(m is None for m in kept):
        return "summarized" if b <= upto else "dropped"
    if kept == transcript[a:b]:
        return "kept"
    if any(m is not None and m.get("content") == PLACEHOLDER for m in kept):
        return "cleared"
    return "shortened"


def _paint(fate: str, color: bool) -> str:
    cell, code = STYLE[fate]
    return f"\x1b[{code}m{cell}\x1b[0m" if color else cell


def picture(
    transcript: list[Message], work: Work, counter: TokenCounter, *, color: bool, width: int = 80
) -> str:
    """The picture: a cell per group, a legend, and token figures per fate."""
    rows = fates(transcript, work)
    cells = "".join(_paint(f, color) for _, _, f in rows)
    lines = [
        cells[i : i + width * (10 if color else 1)]
        for i in range(0, len(cells), width * (10 if color else 1))
    ]
    before: Counter[str] = Counter()
    groups_of: Counter[str] = Counter()
    for a, b, fate in rows:
        before[fate] += counter.count(transcript[a:b])
        groups_of[fate] += 1
    budget = work.limits.budget
    total_before, total_after = counter.count(transcript, work.tools), work.tokens()
    out = [
        f"{len(transcript)} messages, {len(rows)} turn groups; budget {budget} tokens",
        *lines,
        "",
    ]
    for fate in STYLE:
        if groups_of[fate]:
            out.append(
                f"  {_paint(fate, color)} {fate:<10} {groups_of[fate]:>5} groups "
                f"{before[fate]:>9} tokens"
            )
    out.append(
        f"tokens: {total_before} before -> {total_after} after "
        f"(target {work.limits.target}, budget {budget})"
    )
    out.append(
        "applied: "
        + (", ".join(f"{a['strategy']} (-{a['saved']})" for a in work.applied) or "nothing")
    )
    return "\n".join(out)


def _counter(kind: str) -> TokenCounter:
    """The counter asked for; `ConfigError` when tiktoken's files cannot be loaded."""
    if kind != "tiktoken":
        return HeuristicCounter()
    try:
        directory = Settings().tiktoken_dir
    except ValueError as exc:  # pydantic's errors: a malformed PREFIT_* variable
        raise ConfigError(f"invalid settings: {exc}") from None
    return TiktokenCounter(directory=directory)


def inspect_command(argv: list[str] | None = None) -> int:
    """`prefit inspect FILE --window N [--model M] [--counter tiktoken|heuristic]`."""
    parser = argparse.ArgumentParser(prog="prefit inspect", description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument(
        "--window", type=int, required=True, help="the model's input window in tokens"
    )
    parser.add_argument("--model")
    parser.add_argument("--counter", choices=["tiktoken", "heuristic"], default="heuristic")
    parser.add_argument("--reserve-output", type=int, default=4096)
    parser.add_argument("--no-color", action="store_true")
    args = parser.parse_args(argv)
    try:  # a file that is not UTF-8 JSON is a ValueError (UnicodeDecodeError, JSONDecodeError)
        transcript, tools = load_conversation(args.file)
    except (OSError, ValueError) as exc:
        print(f"prefit inspect: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    try:
        counter = _counter(args.counter)
        policy = ContextPolicy(
            args.window,
            reserve_output=args.reserve_output,
            counter=counter,
            summarizer=ExtractiveSummarizer(),
        )
        work = asyncio.run(
            policy.cut(transcript, tools=tools, model=args.model, book=SummaryBook())
        )
        shorten_protected(work, work.limits.budget)  # as prepare does before refusing
        shed_kept(work, work.limits.budget)
    except PrefitError as exc:
        print(f"prefit inspect: {exc}", file=sys.stderr)
        return 2
    color = sys.stdout.isatty() and not args.no_color
    print(picture(transcript, work, counter, color=color))
    if work.tokens() > work.limits.budget:
        print(
            "DOES NOT FIT: the head and the recent turns exceed the budget even with their tool "
            "outputs shortened",
            file=sys.stderr,
        )
        return 1
    return 0
