"""What the agent still knows: later-needed artifacts kept in the fitted prompt, per method.

Real agent transcripts are replayed turn by turn: at every point where the agent is called
(each assistant message, the prompt being everything before it), each method fits that
prompt to the window, and we count, of the *artifacts* the conversation has seen so far that
the rest of the run mentions again, the share still present in the fitted prompt, and the
prompt tokens it sends. Artifacts are what an agent needs exactly, not in gist: file paths,
code identifiers, error names, booking/order ids, URLs and long numbers (`artifacts()`, the
one extractor, used only for measuring here). "Requests" is the share of the person's own
messages so far (not context a client handed over) still found in the prompt, verbatim up to
whitespace and punctuation (their first 120 characters).

Methods, all to the same budget (window minus prefit's 4,096 reserved for the reply):
- prefit, summaries made ahead: `ContextPolicy.prepare` with the conversation's book, which
  a simulated worker fills as the service's does: after each point, `plan_summary` on the
  prompt just served and, when it plans one, `build_record` with the extractive summarizer
  (the offline default), ready for the next point;
- prefit, no summaries: `prepare` with no book (truncate, clear, drop);
- trim_messages: langchain-core's, strategy "last", system kept, starting on a human turn;
- observation masking (JetBrains, "The Complexity Trap", 2025): every message kept, the tool
  outputs older than the last M turn groups replaced by a placeholder, M the largest that
  fits the budget (the oldest groups after the task dropped too when even M = 0 is over).

A prompt prefit refuses (`DoesNotFit`: its head and recent turns alone are over the budget)
keeps nothing and sends nothing; the table says how many. Only points whose whole prompt is
over prefit's trigger (0.85 x budget) count: below it no method cuts anything. At most
`--points` of them per transcript and window, evenly spaced, are measured (the worker still
runs at every point). Shares are over all (point, artifact) pairs. Counts are tiktoken's
o200k_base when ../shared/tiktoken holds it, else the heuristic.

    uv run python -m bench.artifacts [--windows 8192,16384,32768] [--points 12] [--files N]
        [--index-share 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import convert_to_openai_messages, trim_messages

from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import MessageCounter
from shared.errors import DoesNotFit
from shared.head import handed_over
from shared.messages import Message, groups, text_of
from shared.policy import ContextPolicy
from shared.strategies.summarize import INDEX_SHARE
from shared.summaries.book import SummaryBook
from shared.summaries.extractive import ExtractiveSummarizer
from shared.summaries.incremental import build_record
from tests.conftest import TIKTOKEN_DIR, load_transcript, transcript_files

WINDOWS = (8192, 16384, 32768)
MASK = "[old tool output omitted]"
REQUEST_CHARS = 120

# The one artifact extractor (for measuring only; prefit's index has its own rules).
_ARTIFACT = re.compile(
    r"https?://[^\s\"'<>()\[\]{}`]+"  # URLs
    r"|(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+"  # paths with a directory
    r"|\b[A-Za-z_][\w-]*\.(?:py|pyi|js|ts|tsx|json|ya?ml|toml|md|rst|txt|cfg|ini|c|h|cpp|rs|go"
    r"|java|rb|php|sh|sql|html|css|csv|xml)\b"  # bare file names
    r"|\b[A-Z]\w*(?:Error|Exception|Warning)\b"  # error names
    r"|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"  # snake_case identifiers, user ids
    r"|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b"  # camel/Pascal
    r"|\b[a-z_]\w*(?:\.[A-Za-z_]\w*)+\b"  # dotted names (module.attr)
    r"|#?\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,12}\b"  # booking/order ids: ZFA04Y
    r"|\b\d[\d,.:-]{4,}\d\b"  # long numbers: ids, amounts, dates, times
)
_WORDS = re.compile(r"\W+")
_TAG = re.compile(r"</?[A-Za-z_][\w-]{0,40}\s*/?>")


def artifacts(text: str) -> set[str]:
    """The artifacts named in `text` (at least 5 characters, trailing dots dropped)."""
    found = (m.group(0).rstrip(".,:-") for m in _ARTIFACT.finditer(text))
    return {a for a in found if len(a) >= 5}


def message_text(m: Message) -> str:
    """What a message shows the model: its text and its tool calls' arguments."""
    parts = [text_of(m)]
    for call in m.get("tool_calls") or []:
        args = (call.get("function") or {}).get("arguments", "")
        parts.append(args if isinstance(args, str) else json.dumps(args))
    return "\n".join(parts)


def _normal(text: str) -> str:
    return _WORDS.sub(" ", _TAG.sub(" ", text)).lower().strip()


@dataclass
class Tally:
    """One method's sums at one window."""

    needed: int = 0
    kept: int = 0
    requests: int = 0
    requests_kept: int = 0
    points: int = 0
    tokens: int = 0
    with_summary: int = 0
    stale: int = 0
    refused: int = 0
    seconds: float = 0.0

    def add(self, need: set[str], prompt: Sequence[Message], tokens: int, asks: list[str]) -> None:
        text = "\n".join(message_text(m) for m in prompt)
        normal = _normal(text)
        self.needed += len(need)
        self.kept += sum(a in text for a in need)
        self.requests += len(asks)
        self.requests_kept += sum(r in normal for r in asks)
        self.points += 1
        self.tokens += tokens


@dataclass
class Replay:
    """One transcript replayed at one window (a builder of the tallies)."""

    msgs: list[Message]
    window: int
    counter: MessageCounter
    points: int
    index_share: float = INDEX_SHARE
    tallies: dict[str, Tally] = field(default_factory=dict)

    def run(self, loop: asyncio.AbstractEventLoop) -> None:
        ahead = ContextPolicy(self.window, counter=self.counter, index_share=self.index_share)
        bare = ContextPolicy(self.window, counter=self.counter)
        budget = ahead.budget(None)
        book = SummaryBook()
        summarizer = ExtractiveSummarizer()
        calls = [p for p, m in enumerate(self.msgs) if p and m.get("role") == "assistant"]
        over = [p for p in calls if self._tokens(self.msgs[:p]) > ahead.trigger * budget]
        measured = set(_spread(over, self.points))
        last = _last_mentions(self.msgs)
        seen: set[str] = set()
        done = 0
        for p in calls:
            for m in self.msgs[done:p]:
                seen |= artifacts(message_text(m))
            done = p
            prompt = self.msgs[:p]
            if p in measured:
                need = {a for a in seen if last[a] >= p}
                asks = _requests(prompt)
                self._measure(loop, ahead, bare, prompt, book, budget, need, asks)
            plan = ahead.plan_summary(prompt, book=book)
            if plan is not None:
                built = loop.run_until_complete(
                    build_record(
                        prompt, start=plan.start, cut=plan.cut, previous=plan.previous,
                        summarizer=summarizer, counter=self.counter, model=None,
                        chunk_tokens=ahead.summarize_params.chunk_tokens,
                        max_summary_tokens=ahead.summarize_params.summary_tokens(budget), now=0.0,
                        index_tokens=ahead.summarize_params.index_tokens(budget),
                    )
                )  # fmt: skip
                book.add(built.record)

    def _tokens(self, msgs: Sequence[Message]) -> int:
        return self.counter.count(msgs, (), None)

    def _measure(
        self,
        loop: asyncio.AbstractEventLoop,
        ahead: ContextPolicy,
        bare: ContextPolicy,
        prompt: list[Message],
        book: SummaryBook,
        budget: int,
        need: set[str],
        asks: list[str],
    ) -> None:
        def timed(name: str, fit: Callable[[], list[Message]]) -> list[Message]:
            start = time.perf_counter()
            tally = self.tallies.setdefault(name, Tally())
            try:
                out = fit()
            except DoesNotFit:  # refused: nothing sent, nothing kept
                out = []
                tally.refused += 1
            tally.seconds += time.perf_counter() - start
            tally.add(need, out, self._tokens(out), asks)
            return out

        report: dict[str, Any] = {}

        def prefit_ahead() -> list[Message]:
            prepared = loop.run_until_complete(ahead.prepare(prompt, book=book, conversation=1))
            report.update(prepared.report or {})
            return prepared.messages

        timed("prefit, summaries made ahead", prefit_ahead)
        tally = self.tallies["prefit, summaries made ahead"]
        tally.with_summary += report.get("summary") is not None
        tally.stale += bool(report.get("stale"))
        timed(
            "prefit, no summaries",
            lambda: loop.run_until_complete(bare.prepare(prompt, conversation=2)).messages,
        )
        timed("trim_messages", lambda: self._trim(prompt, budget))
        timed("observation masking", lambda: mask(prompt, budget, self._tokens))

    def _trim(self, prompt: list[Message], budget: int) -> list[Message]:
        def count(batch: Sequence[Any]) -> int:
            return sum(self.counter.count_message(m) for m in convert_to_openai_messages(batch))

        kept = trim_messages(
            prompt, max_tokens=budget, token_counter=count, strategy="last",
            include_system=True, start_on="human",
        )  # fmt: skip
        out: list[Message] = convert_to_openai_messages(kept)
        return out


def mask(
    prompt: list[Message], budget: int, tokens: Callable[[Sequence[Message]], int]
) -> list[Message]:
    """Observation masking: tool outputs older than the last M turn groups replaced by a
    placeholder, M the largest that fits `budget`; the oldest groups after the first user
    message dropped too when even M = 0 is over."""
    spans = list(groups(prompt))
    if tokens(prompt) <= budget:
        return prompt

    def masked(m_last: int, drop: int = 0) -> list[Message]:
        keep_from = spans[max(0, len(spans) - m_last)][0] if m_last else len(prompt)
        out = [
            {**m, "content": MASK} if m.get("role") == "tool" and i < keep_from else m
            for i, m in enumerate(prompt)
        ]
        if not drop:
            return out
        first = next((i for i, m in enumerate(prompt) if m.get("role") == "user"), 0)
        lo = next((a for a, _ in spans if a > first), len(prompt))
        cut = [(a, b) for a, b in spans if a >= lo][:drop]
        gone = {i for a, b in cut for i in range(a, b)}
        return [m for i, m in enumerate(out) if i not in gone]

    lo, hi = 0, len(spans)  # the largest M whose prompt fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens(masked(mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    out = masked(lo)
    drop = 0
    while tokens(out) > budget and drop < len(spans):
        drop += 1
        out = masked(0, drop)
    return out


def _spread(points: list[int], count: int) -> list[int]:
    """At most `count` of `points`, evenly spaced, the last included."""
    if len(points) <= count:
        return points
    step = len(points) / count
    return [points[min(len(points) - 1, int((k + 1) * step) - 1)] for k in range(count)]


def _last_mentions(msgs: list[Message]) -> dict[str, int]:
    """Each artifact's last mention: the index of the last message that names it."""
    return {a: p for p, m in enumerate(msgs) for a in artifacts(message_text(m))}


def _requests(prompt: list[Message]) -> list[str]:
    """The person's requests so far, normalized (see the module's docstring); none in a
    transcript whose tool outputs come as user messages (the "plain" ones)."""
    out: list[str] = []
    if not any(m.get("role") == "tool" for m in prompt):
        return out
    for i, m in enumerate(prompt):
        if m.get("role") == "user" and text_of(m).strip() and not handed_over(prompt, i):
            out.append(_normal(text_of(m))[:REQUEST_CHARS])
    return [r for r in out if r]


def _files(limit: int | None) -> Iterator[list[Message]]:
    for path in transcript_files()[:limit]:
        msgs = load_transcript(Path(path))["messages"]
        if sum(m.get("role") == "assistant" for m in msgs) >= 3:
            yield msgs


def run(
    windows: Iterable[int], points: int, limit: int | None, index_share: float = INDEX_SHARE
) -> dict[int, dict[str, Tally]]:
    """The tallies per window, over the transcripts."""
    counter: MessageCounter = (
        TiktokenCounter(directory=TIKTOKEN_DIR)
        if (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file()
        else HeuristicCounter()
    )
    loop = asyncio.new_event_loop()
    out: dict[int, dict[str, Tally]] = {}
    transcripts = list(_files(limit))
    for window in windows:
        totals: dict[str, Tally] = {}
        for msgs in transcripts:
            replay = Replay(msgs, window, counter, points, index_share)
            replay.run(loop)
            for name, t in replay.tallies.items():
                total = totals.setdefault(name, Tally())
                for f in total.__dataclass_fields__:
                    setattr(total, f, getattr(total, f) + getattr(t, f))
        out[window] = totals
    loop.close()
    return out


def table(results: dict[int, dict[str, Tally]]) -> str:
    """The results as a markdown table."""
    lines = [
        "| window | method | points | artifacts kept | requests kept | prompt tokens | ms/call |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for window, totals in results.items():
        for name, t in totals.items():
            extra = ""
            if t.with_summary or name.startswith("prefit, summaries"):
                extra = f" ({t.with_summary} with a summary, {t.stale} stale)"
            if t.refused:
                extra += f" ({t.refused} refused)"
            lines.append(
                f"| {window // 1000}k | {name}{extra} | {t.points} | "
                f"{t.kept / max(1, t.needed):.2f} | {t.requests_kept / max(1, t.requests):.2f} | "
                f"{t.tokens / max(1, t.points) / 1000:.1f}k | "
                f"{1000 * t.seconds / max(1, t.points):.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--index-share", type=float, default=INDEX_SHARE)
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    start = time.perf_counter()
    results = run(windows, args.points, args.files, args.index_share)
    print(table(results))
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
