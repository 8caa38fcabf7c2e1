"""Before refusing, prepare shortens the tool outputs of the head and the recent turns."""

from __future__ import annotations

from typing import Any

import pytest

from shared.counting.counters import HeuristicCounter
from shared.errors import DoesNotFit
from shared.messages import Message
from shared.policy import ContextPolicy
from shared.strategies.lastresort import FLOOR_CHARS, NAME, PART_PLACEHOLDER, PARTS_NAME
from tests.builders import tool_turn
from tests.shared.invariants import assert_justified, check

pytestmark = pytest.mark.anyio

COUNTER = HeuristicCounter()


def read(i: int, output: str) -> list[Message]:
    """A call reading file i, and its output between markers BEGINi and ENDi."""
    text = f"BEGIN{i} " + output + f" END{i}"
    return tool_turn(f"c{i}", "read_file", f'{{"path": "f{i}.py"}}', text)


def session(outputs: list[int]) -> list[Message]:
    """A task, then one tool call per size in `outputs` (the last ones are the recent turns)."""
    msgs: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i, size in enumerate(outputs):
        msgs += read(i, "x" * size)
    return msgs


async def test_large_outputs_in_the_recent_turns_are_shortened_not_refused() -> None:
    """Three 7,900-char outputs in the protected turns of a 6k window: it fits, and says so."""
    msgs = session([500] * 5 + [7_900] * 3)
    policy = ContextPolicy(6_000, counter=COUNTER, reserve_output=1_000)
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    [entry] = [a for a in out.report["applied"] if a["strategy"] == NAME]
    assert entry["saved"] > 0 and entry["floor_chars"] == FLOOR_CHARS
    tail = [i for i, m in enumerate(msgs) if m.get("role") == "tool"][-3:]
    assert set(entry["messages"]) <= set(tail) and entry["messages"] == sorted(entry["messages"])
    for i in entry["messages"]:
        short = next(m for m in out.messages if m.get("tool_call_id") == msgs[i]["tool_call_id"])
        text = short["content"]
        assert text.startswith(f"BEGIN{msgs[i]['tool_call_id'][1:]}") and text.endswith(
            "END" + msgs[i]["tool_call_id"][1:]
        )
        assert "characters cut to save context" in text and len(text) < len(msgs[i]["content"])


async def test_oldest_output_is_cut_first_and_the_last_one_last() -> None:
    """When cutting the older outputs is enough, the very last result stays whole."""
    msgs = session([300, 7_900, 7_900, 7_900])
    policy = ContextPolicy(7_000, counter=COUNTER, reserve_output=1_000)
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    [entry] = [a for a in out.report["applied"] if a["strategy"] == NAME]
    last = len(msgs) - 1
    assert last not in entry["messages"]
    assert out.messages[-1] == msgs[-1]


async def test_cuts_go_only_as_deep_as_needed() -> None:
    """A small excess takes a little off one output, not all of them down to the floor."""
    msgs = session([7_900, 7_900, 7_900])
    policy = ContextPolicy(7_000, counter=COUNTER, reserve_output=300)
    out = await policy.prepare(msgs)
    tools = [m for m in out.messages if m.get("role") == "tool"]
    assert max(len(m["content"]) for m in tools) > FLOOR_CHARS * 2
    assert COUNTER.count(out.messages) <= policy.budget(None)


async def test_does_not_fit_only_when_the_floor_is_not_enough() -> None:
    """A recent user message larger than the budget cannot be cut: DoesNotFit, with figures."""
    msgs = session([5_000, 5_000])
    msgs.append({"role": "user", "content": "paste: " + "p" * 30_000})
    policy = ContextPolicy(6_000, counter=COUNTER, reserve_output=1_000)
    with pytest.raises(DoesNotFit) as info:
        await policy.prepare(msgs)
    e = info.value
    assert e.floor_chars == FLOOR_CHARS and "1000 characters" in str(e)
    assert_justified(e)
    # the figures are of the tail as it stands: outputs at the floor, the paste whole
    assert e.tail_tokens < COUNTER.count(msgs[-5:]) and e.tail_tokens > 30_000 / 3.5


async def test_a_long_reply_among_the_recent_turns_is_shortened_when_outputs_are_not_enough() -> (
    None
):
    """An agent's 33k-character reply in the protected turns of a 6k window (as in a real
    SWE-bench run): cut in its middle, not refused; the task and the last message whole."""
    msgs = session([500] * 4)
    reply = "BEGINR " + "thinking aloud " * 2_200 + " ENDR"
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go on"}]
    policy = ContextPolicy(6_000, counter=COUNTER, reserve_output=1_000)
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    [entry] = [a for a in out.report["applied"] if a["strategy"] == NAME]
    assert len(msgs) - 2 in entry["messages"]
    short = next(m for m in out.messages if str(m.get("content")).startswith("BEGINR"))
    assert short["content"].endswith("ENDR") and len(short["content"]) < len(reply)
    assert out.messages[1] == msgs[1] and out.messages[-1] == msgs[-1]


async def test_refusal_figures_add_up_under_pressure() -> None:
    """At pressure 0.5 the refusal's parts are scaled as its total is, so they add up to it
    (within a few tokens of per-message rounding) instead of to half of it."""
    msgs = session([5_000, 5_000])
    msgs.append({"role": "user", "content": "paste: " + "p" * 30_000})
    policy = ContextPolicy(12_000, counter=COUNTER, reserve_output=1_000)
    with pytest.raises(DoesNotFit) as info:
        await policy.prepare(msgs, pressure=0.5)
    e = info.value
    parts = e.head_tokens + e.tail_tokens + e.tools_tokens + e.other_tokens
    assert abs(parts - e.tokens) <= 8, (parts, e.tokens)
    assert_justified(e)


def screenshot_session(kinds: list[str]) -> list[Message]:
    """A task, one tool call per kind returning a short text and an image, then "go on"."""
    msgs = session([])
    for i, kind in enumerate(kinds):
        image: dict[str, Any] = (
            {"type": "image_url", "image_url": {"url": "https://x.test/s.png"}}
            if kind == "image_url"
            else {"type": kind, "source": {"type": "url", "url": "https://x.test/s.png"}}
        )
        msgs += tool_turn(f"c{i}", "screenshot", "{}", "")
        msgs[-1]["content"] = [{"type": "text", "text": f"shot {i}"}, image]
    msgs.append({"role": "user", "content": "go on"})
    return msgs


async def test_images_of_recent_tool_results_give_way_before_a_refusal() -> None:
    """Screenshots (1,600 tokens each) in the protected turns of a 3k window: the oldest
    kept one is replaced with a placeholder, the last one kept as that is enough; it fits."""
    msgs = screenshot_session(["image", "image_url", "image"])
    policy = ContextPolicy(3_000, counter=COUNTER, reserve_output=500)
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    [entry] = [a for a in out.report["applied"] if a["strategy"] == PARTS_NAME]
    results = [i for i, m in enumerate(msgs) if m.get("role") == "tool"]
    assert entry["messages"] == [results[1]] and entry["parts"] == 1 and entry["saved"] > 0
    first, last = [m for m in out.messages if m.get("role") == "tool"][-2:]
    placeholder = {"type": "text", "text": PART_PLACEHOLDER.format(kind="image_url")}
    assert first["content"] == [msgs[results[1]]["content"][0], placeholder]
    assert last == msgs[results[2]] and out.messages[-1] == msgs[-1]
    assert COUNTER.count(out.messages) <= policy.budget(None)


async def test_images_of_the_last_message_are_never_replaced() -> None:
    """When the transcript ends with the result holding the image, that image stays: the
    prompt still does not fit, so prepare refuses."""
    msgs = screenshot_session(["image", "image"])[:-1]
    policy = ContextPolicy(1_500, counter=COUNTER, reserve_output=100)
    with pytest.raises(DoesNotFit):
        await policy.prepare(msgs)
