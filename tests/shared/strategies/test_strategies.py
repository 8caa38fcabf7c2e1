"""Each strategy alone: what it changes, what it never touches, what it reports."""

from __future__ import annotations

from typing import Any

import pytest

from shared.counting.counters import HeuristicCounter
from shared.errors import ConfigError
from shared.messages import Message
from shared.policy import ContextPolicy
from shared.strategies import ClearToolResults, DropOldest, TruncateToolResults, Work
from shared.strategies.clear import PLACEHOLDER
from shared.strategies.truncate import cut_text

pytestmark = pytest.mark.anyio

COUNTER = HeuristicCounter()


def agent(turns: int, output: str = "o" * 500) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"{i}:{output}"},
        ]
    return msgs


def work_for(msgs: list[Message], window: int = 4000, keep_recent: int = 3) -> Work:
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=0, keep_recent=keep_recent)
    return policy._work(msgs, (), None, None, 1.0, policy.limits(None))


async def apply(strategy: Any, work: Work) -> Work:
    await strategy.apply(work)
    return work


def test_cut_text_keeps_start_and_end_and_says_how_much() -> None:
    """70% of the kept characters come from the start, the rest from the end."""
    text = "A" * 700 + "M" * 10_000 + "Z" * 300
    out = cut_text(text, 1000, 0.7)
    assert out.startswith("A" * 700) and out.endswith("Z" * 300)
    assert "[... 10000 characters cut to save context ...]" in out
    assert cut_text("short", 1000, 0.7) == "short"


async def test_truncate_shortens_only_huge_tool_results() -> None:
    """Tool outputs over max_chars shrink (text parts too); other messages stay identical."""
    msgs = agent(3)
    msgs[3] = {**msgs[3], "content": "x" * 20_000}
    msgs.append({"role": "user", "content": "u" * 20_000})
    work = await apply(TruncateToolResults(max_chars=1000), work_for(msgs))
    assert len(work.messages[3]["content"]) < 1100
    assert work.messages[-1] is msgs[-1] and work.messages[2] is msgs[2]
    assert work.applied[0]["strategy"] == "TruncateToolResults" and work.applied[0]["messages"] == 1
    assert msgs[3]["content"] == "x" * 20_000  # the caller's transcript is never mutated


async def test_clear_keeps_calls_and_the_last_results() -> None:
    """Old outputs become the placeholder; calls, ids and the last keep_last stay."""
    msgs = agent(10)
    work = await apply(ClearToolResults(keep_last=4), work_for(msgs, keep_recent=1))
    tools = [m for m in work.messages if m["role"] == "tool"]
    assert [m["content"] == PLACEHOLDER for m in tools] == [True] * 6 + [False] * 4
    assert [m["tool_call_id"] for m in tools] == [f"c{i}" for i in range(10)]
    assert work.applied[0]["messages"] == 6 and work.applied[0]["saved"] > 0


async def test_clear_never_touches_the_protected_tail() -> None:
    """Even with keep_last=0, tool results in the recent tail keep their content."""
    msgs = agent(6)
    work = await apply(ClearToolResults(keep_last=0), work_for(msgs, keep_recent=2))
    assert [m["content"] == PLACEHOLDER for m in work.messages if m["role"] == "tool"] == [
        True
    ] * 4 + [False] * 2


async def test_drop_oldest_removes_whole_groups_until_target() -> None:
    """Oldest groups go first, with one marker; head and recent tail stay."""
    msgs = agent(30)
    work = await apply(DropOldest(), work_for(msgs, window=3000))
    assert work.tokens() <= work.limits.target
    assert work.messages[:2] == msgs[:2] and work.messages[-6:] == msgs[-6:]
    assert "were dropped here" in work.messages[2]["content"]
    assert work.dropped_groups == work.applied[0]["groups"] > 0
    kept_ids = [m["tool_call_id"] for m in work.messages if m["role"] == "tool"]
    assert kept_ids == [f"c{i}" for i in range(30 - len(kept_ids), 30)]


async def test_drop_oldest_keeps_the_latest_user_request() -> None:
    """A follow-up request the agent then worked on for many turns stays, between two
    markers, when groups on both sides of it must go."""
    follow_up = {"role": "user", "content": "now also update the docs"}
    msgs = [*agent(10), follow_up, *agent(20)[2:]]
    work = await apply(DropOldest(), work_for(msgs, window=3000))
    assert follow_up in work.messages and work.tokens() <= work.limits.target
    at = work.messages.index(follow_up)
    markers = [p for p, m in enumerate(work.messages) if "were dropped" in str(m["content"])]
    assert markers == [2, at + 1] and work.messages[-6:] == msgs[-6:]
    assert work.dropped_messages == len(msgs) - len(work.messages) + 2


async def test_drop_oldest_may_drop_a_huge_latest_request() -> None:
    """A latest request larger than a quarter of the target (a pasted log) may go."""
    pasted = {"role": "user", "content": "log " * 2000}
    msgs = [*agent(10), pasted, *agent(20)[2:]]
    work = await apply(DropOldest(), work_for(msgs, window=6000))
    assert pasted not in work.messages and work.tokens() <= work.limits.target


@pytest.mark.parametrize(
    "make",
    [
        lambda: TruncateToolResults(max_chars=0),
        lambda: TruncateToolResults(head=1.5),
        lambda: ClearToolResults(keep_last=-1),
    ],
)
def test_bad_parameters_raise_config_error(make: Any) -> None:
    """Impossible strategy parameters are refused at construction."""
    with pytest.raises(ConfigError):
        make()
