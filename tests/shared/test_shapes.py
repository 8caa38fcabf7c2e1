"""Shapes of other public agent and chat datasets (tests/shared/shapes.py), at 4k-128k windows,
with three kinds of counter, with and without a summary record: every prompt passes the
invariants, the ledger gives what the strategies give, and the report recounts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shared.counting.calibration import CalibratedCounter
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.errors import DoesNotFit
from shared.hashing import prefix_hashes
from shared.messages import Message, ToolSpec, groups
from shared.policy import ContextPolicy, Prepared
from shared.summaries.book import SummaryBook, SummaryRecord
from tests.shared import shapes
from tests.shared.invariants import assert_justified, check
from tests.shared.test_cut import run_or_refusal, same, twins

pytestmark = pytest.mark.anyio

SHAPES = shapes.all_shapes()
WINDOWS = (4_000, 8_000, 32_000, 128_000)
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


class JsonCounter:
    """A counter written from the reference: only `count`, a quarter of the JSON's length."""

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        size = sum(4 + len(json.dumps(m, ensure_ascii=False)) // 4 for m in messages)
        return 3 + size + (len(json.dumps(list(tools))) // 4 if tools else 0)


def _books(msgs: list[Message]) -> list[SummaryBook | None]:
    ends = [b for _, b in groups(msgs)]
    upto = ends[len(ends) // 2]
    return [None, SummaryBook([SummaryRecord(upto, prefix_hashes(msgs)[upto], "earlier: " * 60)])]


def _verify(
    policy: ContextPolicy, msgs: list[Message], got: Prepared | DoesNotFit, tools: Any
) -> None:
    if isinstance(got, DoesNotFit):
        assert_justified(got)
        return
    check(policy, msgs, got, counter=policy.counter, tools=tools)
    report = got.report
    assert report is not None
    counter = policy._counter(None)
    assert report["tokens_after"] == counter.count(got.messages, tools)
    assert report["tokens_before"] == counter.count(msgs, tools)


@pytest.mark.parametrize("name", sorted(SHAPES))
async def test_shapes_with_content_counters(tiktoken_dir: Path, name: str) -> None:
    """Heuristic and calibrated exact counts: the same prompt both ways, and a sound one."""
    msgs = SHAPES[name]
    tools = TOOLS if name.startswith("openhands") else ()
    calibrated = CalibratedCounter(TiktokenCounter(directory=tiktoken_dir))
    calibrated.observe(None, 1000, 1150)
    counters: list[TokenCounter] = [HeuristicCounter(), calibrated]
    for window in WINDOWS:
        for counter in counters:
            fast, slow = twins(window, counter, reserve_output=min(4096, window // 4))
            for book in _books(msgs):
                got = await run_or_refusal(slow, msgs, tools=tools, book=book)
                same(await run_or_refusal(fast, msgs, tools=tools, book=book), got)
                _verify(slow, msgs, got, tools)
                if name.startswith("too_big"):
                    assert isinstance(got, DoesNotFit)


@pytest.mark.parametrize("name", sorted(SHAPES))
async def test_shapes_with_a_count_only_counter(name: str) -> None:
    """A counter with only `count` gives sound prompts too."""
    msgs = SHAPES[name]
    for window in WINDOWS:
        policy = ContextPolicy(window, counter=JsonCounter(), reserve_output=min(4096, window // 4))
        for book in _books(msgs):
            _verify(policy, msgs, await run_or_refusal(policy, msgs, book=book), ())
