"""A strategy written from the reference works beside the built-ins, in every order."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.counting.counters import HeuristicCounter
from shared.errors import DoesNotFit
from shared.messages import Message
from shared.policy import ContextPolicy
from shared.strategies import ClearToolResults, DropOldest, Summarize, TruncateToolResults, Work
from shared.strategies.drop import drop_marker
from shared.strategies.origins import SYNTHETIC, UNKNOWN
from tests.builders import tool_turn
from tests.shared.generated import transcripts
from tests.shared.invariants import assert_justified, check

pytestmark = pytest.mark.anyio

COUNTER = HeuristicCounter()


class DropChitChat:
    """Drops short assistant messages without tool calls (but the last message), exactly as
    the reference says a strategy works: it replaces `work.messages` and records
    `work.applied`; it knows nothing of `origin`."""

    def __init__(self, max_chars: int = 20) -> None:
        self.max_chars = max_chars

    async def apply(self, work: Work) -> None:
        before = len(work.messages)
        *older, last = work.messages
        work.messages = [*(m for m in older if not self._chit_chat(m)), last]
        if len(work.messages) < before:
            work.applied.append(
                {"strategy": "DropChitChat", "removed": before - len(work.messages)}
            )

    def _chit_chat(self, m: Message) -> bool:
        content = m.get("content")
        return (
            m.get("role") == "assistant"
            and not m.get("tool_calls")
            and isinstance(content, str)
            and len(content) < self.max_chars
        )


class RewriteUsers:
    """Replaces every user message after the first with a fresh, edited copy."""

    async def apply(self, work: Work) -> None:
        seen = False
        out = []
        for m in work.messages:
            if m.get("role") == "user":
                if seen:
                    m = {**m, "content": str(m["content"]).upper()}
                seen = True
            out.append(m)
        work.messages = out


def agent(turns: int) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Book me the cheapest flight to Lisbon."},
    ]
    for i in range(turns):
        results = f"results {i}: " + "r" * 2_500
        msgs += tool_turn("s", "search", f'{{"page": {i}}}', results, "Let me check.")
        msgs.append({"role": "assistant", "content": "ok"})
        msgs.append({"role": "user", "content": f"and page {i + 1}? " + "u" * 300})
    return msgs


BUILT_INS = [TruncateToolResults, ClearToolResults, Summarize, DropOldest]


@pytest.mark.parametrize("custom", [DropChitChat, RewriteUsers])
@pytest.mark.parametrize("window", [3_000, 8_000])
async def test_every_order_of_a_custom_strategy_with_the_built_ins(
    custom: Any, window: int
) -> None:
    """120 orders of one custom strategy and the four built-ins: never a crash, always valid."""
    msgs = agent(30)
    for order in itertools.permutations([custom, *BUILT_INS]):
        steps = [kind() for kind in order]
        policy = ContextPolicy(window, counter=COUNTER, reserve_output=500, strategies=steps)
        try:
            out = await policy.prepare(msgs)
        except DoesNotFit as e:
            assert_justified(e)
            continue
        if custom is DropChitChat:  # RewriteUsers' edits are not from the transcript
            check(policy, msgs, out, counter=COUNTER)
        assert out.messages[:2] == msgs[:2], order
        assert COUNTER.count(out.messages) <= policy.budget(None), order


def test_origins_are_recovered_by_identity_then_content() -> None:
    """Kept objects keep their index, copies find theirs, strangers are unknown."""
    msgs = agent(2)
    policy = ContextPolicy(100_000)
    work = policy._work(list(msgs), (), None, None, 1.0, policy.limits(None))
    copy = dict(msgs[3])
    stranger = {"role": "user", "content": "not in the transcript"}
    work.messages = [msgs[0], msgs[1], copy, stranger, msgs[9]]
    work.align()
    assert work.origin == [0, 1, 3, UNKNOWN, 9]
    assert work.protected(0) and work.protected(4) and not work.protected(3)
    marker = drop_marker(4, 2)
    work.replace([msgs[0], msgs[1], marker, msgs[9]], [0, 1, SYNTHETIC, 9])
    work.messages = [msgs[0], msgs[1], dict(marker), msgs[9]]
    work.align()
    assert work.origin == [0, 1, SYNTHETIC, 9]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts(max_groups=25), st.integers(1_500, 20_000), st.permutations(range(5)))
async def test_generated_transcripts_with_a_custom_strategy_anywhere(
    msgs: list[Message], window: int, order: list[int]
) -> None:
    """Generated transcripts (assistant-first ones too), a custom strategy at any position."""
    kinds = [DropChitChat, *BUILT_INS]
    steps = [kinds[i]() for i in order]
    policy = ContextPolicy(window + 1_000, counter=COUNTER, reserve_output=1_000, strategies=steps)
    try:
        out = await policy.prepare(msgs)
    except DoesNotFit as e:
        assert_justified(e)
        return
    check(policy, msgs, out, counter=COUNTER)
