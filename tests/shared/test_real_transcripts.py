"""The policy's invariants on every real transcript, at four windows, with both counters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.errors import DoesNotFit
from shared.hashing import prefix_hashes
from shared.messages import Message, ToolSpec, groups
from shared.policy import ContextPolicy
from shared.summaries.book import SummaryBook, SummaryRecord
from tests.conftest import load_transcript, needs_transcripts, transcript_files
from tests.shared.invariants import assert_justified, check

WINDOWS = (8_000, 16_000, 32_000, 128_000)
pytestmark = [needs_transcripts, pytest.mark.anyio]


class CountOnlyTiktoken:
    """A counter as a user writes it from the reference: `count` and nothing else."""

    def __init__(self, directory: Path) -> None:
        self._exact = TiktokenCounter(directory=directory)

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        return self._exact.count(messages, tools, model)


@pytest.fixture(scope="module", params=["heuristic", "tiktoken", "count-only"])
def counter(request: pytest.FixtureRequest) -> TokenCounter:
    if request.param == "heuristic":
        return HeuristicCounter()
    tiktoken_dir: Path = request.getfixturevalue("tiktoken_dir")
    if request.param == "count-only":
        return CountOnlyTiktoken(tiktoken_dir)
    return TiktokenCounter(directory=tiktoken_dir)


async def _prepare(
    policy: ContextPolicy, data: dict[str, Any], book: SummaryBook | None = None
) -> Any:
    return await policy.prepare(data["messages"], tools=data.get("tools", ()), book=book)


@pytest.mark.parametrize("path", transcript_files(), ids=lambda p: p.stem[:60])
async def test_invariants_hold_at_every_window(path: Path, counter: TokenCounter) -> None:
    """Fits exactly, keeps pairs, head, last group and order, and is deterministic."""
    data = load_transcript(path)
    tools = data.get("tools", ())
    for window in WINDOWS:
        policy = ContextPolicy(window, counter=counter, reserve_output=1024)
        try:
            first = await _prepare(policy, data)
        except DoesNotFit as e:
            # only legitimate when what may never be cut is itself too big
            assert_justified(e)
            continue
        check(policy, data["messages"], first, counter=counter, tools=tools)
        assert (await _prepare(policy, data)).messages == first.messages, (
            "same input, different output"
        )


def summarizable(path: Path) -> bool:
    """Whether two messages or more stand between the transcript's head and recent turns."""
    head, tail = ContextPolicy(10**7).regions(load_transcript(path)["messages"])
    return tail - head >= 2


@pytest.mark.parametrize(
    "path", [p for p in transcript_files() if summarizable(p)], ids=lambda p: p.stem[:60]
)
async def test_record_reused_only_when_prefix_matches(path: Path) -> None:
    """A stored summary is used for its own prefix and ignored once any earlier message differs."""
    data = load_transcript(path)
    messages, tools = data["messages"], data.get("tools", ())
    counter = HeuristicCounter()
    probe = ContextPolicy(10**7, counter=counter)
    head, tail = probe.regions(messages)
    upto = tail  # the longest record the protected tail allows
    record = SummaryRecord(upto, prefix_hashes(messages)[upto], "STORED SUMMARY")
    # a window where [head][summary][tail] fits under the trigger
    kept = [*messages[:head], {"role": "user", "content": record.text}, *messages[upto:]]
    budget = int(counter.count(kept, tools) / 0.8) + 64
    policy = ContextPolicy(budget + 1024, counter=counter, reserve_output=1024)
    used = await _prepare(policy, data, SummaryBook([record]))
    if counter.count(messages, tools) > policy.trigger * budget:  # over: the record is due
        assert used.report["summary"]["upto"] == upto
        assert any("STORED SUMMARY" in str(m.get("content")) for m in used.messages)
    else:
        assert used.messages == messages  # under the trigger nothing changes
    edited = [*messages[:head], {**messages[head], "content": "edited"}, *messages[head + 1 :]]
    last = next(a for a, b in groups(messages) if b == upto)  # the turn group ending at upto
    for variant in (edited, messages[:last] + messages[upto:]):
        try:
            other = await policy.prepare(variant, tools=tools, book=SummaryBook([record]))
        except DoesNotFit:
            continue
        assert other.report is not None and other.report["summary"] is None
        assert not any("STORED SUMMARY" in str(m.get("content")) for m in other.messages)
