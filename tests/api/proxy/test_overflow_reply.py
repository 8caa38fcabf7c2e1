"""A request asking for a longer reply than the window's reserve is fitted with room for it,
and one no fit leaves room for has its reply lowered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from api.policies import Window
from api.proxy.overflow import LoweredReply, lowered_reply, reply_floor, with_reply_room
from shared.counting.counters import HeuristicCounter
from shared.formats import from_anthropic, to_anthropic
from shared.messages import Message
from shared.settings import ModelWindow
from tests.api.conftest import RESERVE, WINDOW, Recorder
from tests.api.proxy import test_anthropic, test_openai
from tests.api.proxy.conftest import TASK, Proxy, agent_session, serving
from tests.builders import call, result, user
from tests.fakeprovider import FakeProvider, prompt_tokens

REPLY = 6_000  # the provider refuses prompt + REPLY over WINDOW


def near_trigger() -> list[Message]:
    """A transcript under prefit's trigger for the configured reserve (sent as it is), but
    over what fits beside a reply of REPLY tokens."""
    for turns in range(20, 80):
        msgs = agent_session(turns)
        if HeuristicCounter().count(msgs) > WINDOW - REPLY + 500:
            return msgs
    raise AssertionError("no session of the wanted size")


def test_openai_max_completion_tokens_makes_room_for_the_reply(proxy: Proxy) -> None:
    """`max_completion_tokens` over the reserve: the prompt is cut to leave that room, so the
    provider (which counts prompt + reply) answers at once, with no overflow and no retry."""
    proxy.fake.limit_tokens = WINDOW - REPLY
    raw = test_openai.sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=near_trigger(),  # type: ignore[arg-type]
        max_completion_tokens=REPLY,
    )
    assert (raw.headers["x-prefit-fit"], raw.headers["x-prefit-retries"]) == ("applied", "0")
    [got] = proxy.fake.received
    assert got.status == 200 and got.body["max_completion_tokens"] == REPLY
    assert prompt_tokens("openai", got.body) <= WINDOW - REPLY


def test_anthropic_max_tokens_makes_room_for_the_reply(proxy: Proxy) -> None:
    """The same with Anthropic's required `max_tokens`."""
    proxy.fake.limit_tokens = WINDOW - REPLY
    system, messages = to_anthropic(near_trigger())
    raw = test_anthropic.sdk(proxy).messages.with_raw_response.create(
        model=proxy.model,
        system=system,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
        max_tokens=REPLY,
    )
    assert (raw.headers["x-prefit-fit"], raw.headers["x-prefit-retries"]) == ("applied", "0")
    [got] = proxy.fake.received
    assert got.status == 200 and prompt_tokens("anthropic", got.body) <= WINDOW - REPLY


def test_a_small_reply_keeps_the_configured_reserve(proxy: Proxy) -> None:
    """A reply within the reserve changes nothing: the same transcript goes as it came."""
    raw = test_openai.sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=near_trigger(),  # type: ignore[arg-type]
        max_tokens=RESERVE,
    )
    assert raw.headers["x-prefit-fit"] == "unchanged"


@pytest.mark.parametrize(
    ("body", "reserve"),
    [
        ({}, 1_000),
        ({"max_tokens": 500}, 1_000),
        ({"max_tokens": 4_000}, 4_000),
        ({"max_completion_tokens": 3_000, "max_tokens": 9_000}, 3_000),
        ({"max_tokens": 20_000}, 1_000),  # the whole window: fitting cannot help
        ({"max_tokens": True}, 1_000),
        ({"max_tokens": "4000"}, 1_000),
    ],
)
def test_the_reply_room_is_the_requests_when_larger(body: dict[str, object], reserve: int) -> None:
    """Only a positive integer larger than the reserve and smaller than the window counts."""
    window = Window("m", 20_000, 1_000)
    assert with_reply_room(window, body).reserve_output == reserve


# --- a reply the window cannot leave room for (issue 15, item 3) ---------------------------

WIDE = 60_000  # the window of a model Claude Code asks `max_tokens: 32000` of
ASKED = 32_000


@pytest.fixture
def wide(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder
) -> Iterator[Proxy]:
    """The proxy in front of the fake, for a model with a 60k window (reserve 4,096)."""
    fake.limit_tokens = WIDE
    windows = {model: ModelWindow(max_input_tokens=WIDE, reserve_output=4_096)}
    with serving(redis_url, tenant, model, fake, recorder, models=windows) as proxy:
        yield proxy


def claude_code_session(head_chars: int, turns: int = 12) -> tuple[str, list[Message]]:
    """A Claude Code-like Anthropic transcript: a system prompt of `head_chars`, the task,
    tool calls with long arguments and outputs, and a last message of ~1.7k tokens."""
    system = "You are Claude Code. Follow the rules. " * (head_chars // 39)
    msgs: list[Message] = [user(TASK)]
    for k in range(turns):
        args = json.dumps({"cmd": f"cat <<EOF > f{k}.py\n" + "x = 1\n" * 500})
        msgs += [call(f"call_{k}", args=args), result(f"call_{k}", "out " * 300)]
    msgs.append(user("Now write this module again, in full:\n" + "def f(x): return x\n" * 300))
    return system, to_anthropic(msgs)[1]


def send_wide(proxy: Proxy, system: str, messages: list[Message], **kw: Any) -> Any:
    return test_anthropic.sdk(proxy).messages.with_raw_response.create(
        model=proxy.model,
        system=system,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=ASKED,
        timeout=60,  # else the SDK refuses a long reply unstreamed
        **kw,
    )


def within_window(proxy: Proxy) -> int:
    """What the one request the fake got asked for; asserts prompt + reply fit the window."""
    [got] = proxy.fake.received
    reply = int(got.body["max_tokens"])
    assert got.status == 200 and prompt_tokens("anthropic", got.body) + reply <= WIDE
    return reply


def test_a_reply_no_fit_leaves_room_for_is_lowered_to_what_the_window_leaves(wide: Proxy) -> None:
    """27k+ of head and recent turns on a 60k window with `max_tokens: 32000`: fitted, the
    reply lowered to what the window leaves (within the floor and the ask), said in a header;
    no overflow at the provider, prompt + reply within the window."""
    system, messages = claude_code_session(head_chars=95_000)
    counter = HeuristicCounter()
    head = counter.count(from_anthropic(system, messages[:1]))
    assert head > 27_000 and head + counter.count(from_anthropic(None, messages[-1:])) > 28_000
    raw = send_wide(wide, system, messages)
    assert raw.headers["x-prefit-fit"] == "applied"
    sent = within_window(wide)
    assert reply_floor(ASKED) <= sent < ASKED
    assert raw.headers["x-prefit-max-tokens"] == f"lowered {ASKED} -> {sent}"
    assert "x-prefit-thinking-budget" not in raw.headers
    body = wide.fake.received[0].body
    assert body["messages"][-1] == messages[-1] and body["system"] == system


def test_a_thinking_budget_over_the_lowered_reply_is_lowered_too(wide: Proxy) -> None:
    """Extended thinking: `max_tokens` must stay over `budget_tokens`, so a budget the
    lowered reply does not exceed is lowered to half of it, and said in a header."""
    system, messages = claude_code_session(head_chars=95_000)
    thinking = {"type": "enabled", "budget_tokens": 31_000}
    raw = send_wide(wide, system, messages, thinking=thinking)
    sent = within_window(wide)
    budget = wide.fake.received[0].body["thinking"]["budget_tokens"]
    assert budget == max(1_024, sent // 2) and budget < sent
    assert raw.headers["x-prefit-thinking-budget"] == f"lowered 31000 -> {budget}"


def test_a_reply_the_window_leaves_too_little_for_is_forwarded_unfitted(wide: Proxy) -> None:
    """A head leaving less than the floor (an eighth of the reply asked for): as before,
    forwarded unchanged with `skipped (does not fit)`, its reply untouched."""
    system, messages = claude_code_session(head_chars=190_000, turns=2)
    raw = send_wide(wide, system, messages)
    assert raw.headers["x-prefit-fit"] == "skipped (does not fit)"
    assert "x-prefit-max-tokens" not in raw.headers
    [got] = wide.fake.received
    assert got.body["max_tokens"] == ASKED and got.body["messages"] == messages


def test_a_reply_over_the_whole_window_is_lowered_beside_a_prompt_that_fits(wide: Proxy) -> None:
    """`max_tokens: 64000` on a 60k window, a short transcript: sent as it is, the reply
    lowered to what the window leaves (the provider refuses prompt + reply over it)."""
    system, messages = claude_code_session(head_chars=4_000, turns=2)
    raw = send_wide(wide, system, messages, extra_body={"max_tokens": 64_000})
    assert raw.headers["x-prefit-fit"] == "unchanged"
    sent = within_window(wide)
    assert raw.headers["x-prefit-max-tokens"] == f"lowered 64000 -> {sent}"
    assert wide.fake.received[0].body["messages"] == messages


@pytest.mark.parametrize(
    ("body", "room", "lowered"),
    [
        ({"max_tokens": 32_000}, 40_000, None),  # room enough: nothing to lower
        ({"max_tokens": 32_000}, 20_000, LoweredReply(32_000, 20_000)),
        ({"max_tokens": 32_000}, 3_999, None),  # under the floor, an eighth
        ({"max_tokens": 2_000}, 1_024, LoweredReply(2_000, 1_024)),  # the floor's least
        ({"max_tokens": 2_000}, 1_023, None),
        ({"max_output_tokens": 32_000}, 20_000, LoweredReply(32_000, 20_000)),
        ({"max_completion_tokens": 9_000}, 5_000, LoweredReply(9_000, 5_000)),
        (
            {"max_tokens": 32_000, "thinking": {"type": "enabled", "budget_tokens": 30_000}},
            20_000,
            LoweredReply(32_000, 20_000, 30_000, 10_000),
        ),
        (
            {"max_tokens": 32_000, "thinking": {"type": "enabled", "budget_tokens": 10_000}},
            20_000,
            LoweredReply(32_000, 20_000),
        ),
        (  # no thinking budget of at least 1,024 under the reply: not lowered
            {"max_tokens": 8_000, "thinking": {"type": "enabled", "budget_tokens": 4_000}},
            1_024,
            None,
        ),
        ({}, 100, None),
    ],
)
def test_the_lowered_reply_keeps_the_floor_and_the_thinking_budget_under_it(
    body: dict[str, Any], room: int, lowered: LoweredReply | None
) -> None:
    """The reply rule of api/proxy/overflow.py on its own."""
    assert lowered_reply(body, room) == lowered


def test_a_lowered_reply_lowers_every_reply_field_over_it() -> None:
    """Every output field over the lowered figure goes down to it; the rest stays."""
    body = {"max_tokens": 9_000, "max_completion_tokens": 500, "thinking": {"type": "enabled"}}
    out = LoweredReply(9_000, 4_000, 5_000, 2_000).apply(body)
    assert out == {
        "max_tokens": 4_000,
        "max_completion_tokens": 500,
        "thinking": {"type": "enabled", "budget_tokens": 2_000},
    }
    assert body["max_tokens"] == 9_000  # the client's body is not changed in place
