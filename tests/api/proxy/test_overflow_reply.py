"""A request asking for a longer reply than the window's reserve is fitted with room for it,
and one no fit leaves room for has its reply lowered."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from api.policies import Window
from api.proxy.overflow import LoweredReply, reply_beside, reply_floor, with_reply_room
from shared.counting.counters import HeuristicCounter
from shared.errors import ReplyDoesNotFit
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
        ({"max_tokens": 5_000}, 5_000),
        ({"max_tokens": 9_000}, 5_000),  # at most a quarter of the window
        ({"max_tokens": 64_000}, 5_000),  # the whole window and more: the same
        ({"max_tokens": True}, 1_000),
        ({"max_tokens": "4000"}, 1_000),
    ],
)
def test_the_reply_room_is_the_requests_when_larger(body: dict[str, object], reserve: int) -> None:
    """Only a positive integer larger than the reserve counts, up to a quarter of the window."""
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
    assert reply_floor({"max_tokens": ASKED}) <= sent < ASKED
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


def test_a_reply_the_window_leaves_too_little_for_is_refused(wide: Proxy) -> None:
    """A head leaving less than the reply floor (1,024 tokens) of the window even cut to the
    last turn: refused with a 400 in the provider's shape saying so, nothing forwarded (the
    provider would refuse it), nothing stored."""
    system, messages = claude_code_session(head_chars=230_000, turns=2)
    with pytest.raises(anthropic.BadRequestError) as refused:
        send_wide(wide, system, messages)
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("prompt is too long: ") and "least reply of 1024 tokens" in message
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert wide.fake.received == []


def test_a_reply_over_the_whole_window_is_lowered_beside_a_prompt_that_fits(wide: Proxy) -> None:
    """`max_tokens: 64000` on a 60k window, a short transcript: sent as it is, the reply
    lowered to what the window leaves (the provider refuses prompt + reply over it)."""
    system, messages = claude_code_session(head_chars=4_000, turns=2)
    raw = send_wide(wide, system, messages, extra_body={"max_tokens": 64_000})
    assert raw.headers["x-prefit-fit"] == "unchanged"
    sent = within_window(wide)
    assert raw.headers["x-prefit-max-tokens"] == f"lowered 64000 -> {sent}"
    assert wide.fake.received[0].body["messages"] == messages


THINKING = {"type": "enabled", "budget_tokens": 30_000}
W = Window("m", 40_000, 4_096)  # usable: 39,200 (2% kept for the estimate's error)


@pytest.mark.parametrize(
    ("body", "prompt", "cap", "lowered"),
    [
        ({"max_tokens": 8_000}, 30_000, None, None),  # prompt + reply fit: as asked
        ({"max_tokens": 32_000}, 20_000, None, LoweredReply(32_000, 19_200)),
        ({"max_tokens": 64_000}, 2_000, None, LoweredReply(64_000, 37_200)),  # over the window
        ({"max_tokens": 32_000}, 38_176, None, LoweredReply(32_000, 1_024)),  # the floor
        ({"max_output_tokens": 32_000}, 20_000, None, LoweredReply(32_000, 19_200)),
        ({"max_completion_tokens": 9_000}, 35_000, None, LoweredReply(9_000, 4_200)),
        ({"max_tokens": 32_000}, 20_000, 6_000, LoweredReply(32_000, 6_000)),  # never raised
        ({"max_tokens": 32_000}, 1_000, 6_000, LoweredReply(32_000, 6_000)),
        ({"max_tokens": 500}, 39_000, None, None),  # asks less than the floor: never lowered
        (
            {"max_tokens": 32_000, "thinking": THINKING},
            20_000,
            None,
            LoweredReply(32_000, 19_200, 30_000, 9_600),
        ),
        (
            {"max_tokens": 32_000, "thinking": {**THINKING, "budget_tokens": 10_000}},
            20_000,
            None,
            LoweredReply(32_000, 19_200),
        ),
        (
            {"max_tokens": 32_000, "thinking": THINKING},
            37_152,
            None,
            LoweredReply(32_000, 2_048, 30_000, 1_024),
        ),  # the floor with thinking: 2,048
        ({}, 39_999, None, None),
    ],
)
def test_the_reply_rule_lowers_within_the_window_never_under_the_floor(
    body: dict[str, Any], prompt: int, cap: int | None, lowered: LoweredReply | None
) -> None:
    """The reply rule of api/proxy/overflow.py on its own: prompt + reply within the window."""
    got = reply_beside(body, W, prompt, cap)
    assert got == lowered
    if got is not None:
        assert prompt + got.sent <= W.max_input_tokens and got.sent >= reply_floor(body)
        assert got.budget_sent is None or got.budget_sent < got.sent


@pytest.mark.parametrize(
    ("body", "prompt"),
    [
        ({"max_tokens": 32_000}, 38_177),
        ({"max_tokens": 32_000, "thinking": THINKING}, 37_153),
        ({"max_tokens": 800}, 39_201),
    ],
)
def test_a_reply_under_the_floor_is_no_fit(body: dict[str, Any], prompt: int) -> None:
    """Less than the floor beside the prompt: `ReplyDoesNotFit` (fit deeper, or refuse)."""
    with pytest.raises(ReplyDoesNotFit):
        reply_beside(body, W, prompt)


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


def test_a_retry_never_raises_the_reply_and_fits_prompt_and_reply(wide: Proxy) -> None:
    """A provider counting 1.25x prefit's estimate refuses prompt + the lowered reply ("input
    length and `max_tokens` exceed context limit"); the retry sends a smaller prompt with a
    reply no larger than the first attempt's, and the client gets the answer."""
    wide.fake.scale = 1.25
    system, messages = claude_code_session(head_chars=95_000)
    raw = send_wide(wide, system, messages, extra_body={"max_tokens": 64_000})
    assert raw.parse().content[0].text  # type: ignore[union-attr]
    sent = [int(r.body["max_tokens"]) for r in wide.fake.received]
    first = wide.fake.received[0]
    assert first.status == 400 and "input length and `max_tokens` exceed" in first.error
    assert wide.fake.received[-1].status == 200 and len(sent) == 1 + int(
        raw.headers["x-prefit-retries"]
    )
    assert all(later <= earlier for earlier, later in itertools.pairwise(sent))
    last = wide.fake.received[-1]
    assert prompt_tokens("anthropic", last.body, 1.25) + sent[-1] <= WIDE
    assert raw.headers["x-prefit-max-tokens"] == f"lowered 64000 -> {sent[-1]}"
