"""A request asking for a longer reply than the window's reserve is fitted with room for it."""

from __future__ import annotations

import pytest

from api.policies import Window
from api.proxy.reserve import with_reply_room
from shared.counters import HeuristicCounter
from shared.formats import to_anthropic
from shared.messages import Message
from tests.api.conftest import RESERVE, WINDOW
from tests.api.proxy import test_anthropic, test_openai
from tests.api.proxy.conftest import Proxy, agent_session
from tests.fakeprovider import prompt_tokens

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
