"""Overflow retries and calibration, against a provider that counts 1.5x prefit's estimate;
the figures of each overflow wording, the retry's pressure, and windows learned."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from api.proxy.dialects.anthropic import anthropic_figures
from api.proxy.dialects.openai import OpenAIDialect, openai_figures
from api.proxy.overflow import (
    FLOOR,
    SHRINK,
    STEP,
    Corrections,
    LearnedWindows,
    Overflow,
    next_pressure,
)
from shared.counting.calibration import SETTLE_AFTER
from shared.counting.counters import HeuristicCounter
from shared.formats import to_anthropic
from shared.messages import Message, validate
from shared.settings import Settings
from tests.api.conftest import WINDOW, Recorder
from tests.api.proxy.conftest import TASK, Proxy, agent_session, serving, wait_for
from tests.builders import assistant, chat, user
from tests.fakeprovider import WORDS, FakeProvider, Reply

SCALE = 1.5


@pytest.fixture
def fake() -> FakeProvider:
    """A provider with the API's window that counts every prompt 1.5x what prefit does."""
    return FakeProvider(limit_tokens=WINDOW, scale=SCALE)


def openai_sdk(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)


def anthropic_sdk(proxy: Proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0)


def ratio(proxy: Proxy) -> float:
    return proxy.store.ratios.get(proxy.tenant, proxy.model) or 1.0


def test_an_openai_overflow_is_retried_and_the_client_sees_only_the_success(
    proxy: Proxy,
) -> None:
    """The error's figures set the retry's pressure; one retry suffices."""
    messages = chat(60)  # under prefit's trigger: sent whole, and too long for the provider
    raw = openai_sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.parse().choices[0].message.content == "".join(WORDS)
    assert raw.headers["x-prefit-retries"] == "1"
    assert "x-prefit-degraded" not in raw.headers  # the retry is the stored prepare's too
    first, second = proxy.fake.received
    assert (first.status, second.status) == (400, 200)
    validate(second.body["messages"])
    assert second.body["messages"][:2] == messages[:2]
    wait_for(lambda: ratio(proxy) > 1.2)  # the overflow's count and the usage, observed


def test_an_anthropic_overflow_is_retried_the_same_way(proxy: Proxy) -> None:
    """ "prompt is too long: N tokens > M maximum" is read and retried like OpenAI's."""
    system, messages = to_anthropic(chat(60))
    raw = anthropic_sdk(proxy).messages.with_raw_response.create(
        model=proxy.model,
        max_tokens=100,
        system=system,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.parse().content[0].text == "".join(WORDS)  # type: ignore[union-attr]
    assert raw.headers["x-prefit-retries"] == "1"
    assert [r.status for r in proxy.fake.received] == [400, 200]


def test_overflows_are_retried_at_most_twice(proxy: Proxy) -> None:
    """Three overflows in a row: the third goes back to the client as the provider said it."""
    proxy.fake.script(*[Reply(400, overflow=True, limit=WINDOW)] * 3)
    with pytest.raises(openai.BadRequestError) as caught:
        openai_sdk(proxy).chat.completions.create(
            model=proxy.model,
            messages=agent_session(60),  # type: ignore[arg-type]
        )
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.response.headers["x-prefit-retries"] == "2"
    assert [r.status for r in proxy.fake.received] == [400, 400, 400]
    sizes = [len(str(r.body["messages"])) for r in proxy.fake.received]
    assert sizes[0] > sizes[1] > sizes[2]


def test_a_streamed_openai_answer_feeds_calibration(proxy: Proxy) -> None:
    """The usage chunk prefit asked for is read (then dropped) and observed."""
    stream = openai_sdk(proxy).chat.completions.create(
        model=proxy.model,
        messages=[user("hi " * 200)],  # type: ignore[list-item]
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "".join(WORDS)
    wait_for(lambda: ratio(proxy) > 1.1)


def test_a_streamed_anthropic_answer_feeds_calibration_with_cached_tokens(proxy: Proxy) -> None:
    """message_start's input + cache read + cache creation tokens are the prompt's count."""
    with anthropic_sdk(proxy).messages.stream(
        model=proxy.model,
        max_tokens=100,
        messages=[user("hi " * 200)],  # type: ignore[list-item]
    ) as stream:
        assert "".join(stream.text_stream) == "".join(WORDS)
    # without the cached parts the fake's usage would say 0.25 x prefit's estimate
    wait_for(lambda: ratio(proxy) > 1.1)


def test_a_non_streamed_answer_feeds_calibration(proxy: Proxy) -> None:
    """`usage.prompt_tokens` of a plain answer is observed for the tenant and model, against
    prefit's estimate of exactly what was sent (the first observation sets the ratio)."""
    openai_sdk(proxy).chat.completions.create(
        model=proxy.model,
        messages=agent_session(60),  # type: ignore[arg-type]
    )
    wait_for(lambda: ratio(proxy) != 1.0)
    assert ratio(proxy) == pytest.approx(SCALE, abs=0.002)


def test_a_streamed_request_that_overflows_is_retried_before_streaming(proxy: Proxy) -> None:
    """The overflow comes before any event: the retried stream is what the client reads."""
    stream = openai_sdk(proxy).chat.completions.create(
        model=proxy.model,
        messages=chat(60),  # type: ignore[arg-type]
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "".join(WORDS)
    assert [r.status for r in proxy.fake.received] == [400, 200]
    assert stream.response.headers["x-prefit-retries"] == "1"


def test_openai_overflow_figures_are_read_from_each_wording() -> None:
    """The prompt count, the maximum and the completion's share, where stated."""
    assert openai_figures(
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130,500 tokens. Please reduce the length of the messages."
    ) == Overflow(130_500, 128_000, None)
    assert openai_figures(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 "
        "tokens (8000 in the messages, 1000 in the completion)."
    ) == Overflow(8000, 8192, 1000)
    assert openai_figures(
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted "
        "in 300000 tokens."
    ) == Overflow(300_000, 272_000, None)
    assert openai_figures("context_length_exceeded") == Overflow()


def test_compatible_servers_overflow_wordings_are_recognised_with_their_figures() -> None:
    """Mistral's and Anthropic's wordings in an OpenAI error, and llama.cpp's (no figures)."""
    assert openai_figures(
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length"
    ) == Overflow(40_000, 32_768, None)
    assert openai_figures("prompt is too long: 210000 tokens > 200000 maximum") == Overflow(
        210_000, 200_000, None
    )
    error = {"message": "the request exceeds the available context size", "code": None}
    assert OpenAIDialect(Settings()).overflow(400, {"error": error}) == Overflow()
    error = {"message": "Rate limit reached for requests", "code": None}
    assert OpenAIDialect(Settings()).overflow(400, {"error": error}) is None


def test_anthropic_overflow_figures_and_other_errors() -> None:
    """Both overflow wordings are read; any other 400 is no overflow."""
    assert anthropic_figures("prompt is too long: 208000 tokens > 200000 maximum") == Overflow(
        208_000, 200_000
    )
    assert anthropic_figures(
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again"
    ) == Overflow(188_240, 200_000, 21_333)
    assert anthropic_figures("max_tokens: Field required") is None


def test_the_pressure_follows_the_figures_and_always_drops() -> None:
    """allowed x E / N, with a margin; a fixed step without figures; never above 0.9 x."""
    figures = Overflow(prompt_tokens=150_000, limit=128_000)
    p = next_pressure(1.0, figures, estimated=100_000, budget=123_904, reserve=4096)
    assert p == pytest.approx(0.9 * 123_904 * 100_000 / (150_000 * 123_904))
    assert next_pressure(0.5, Overflow(), estimated=1, budget=1, reserve=0) == 0.5 * STEP
    generous = Overflow(prompt_tokens=10, limit=1_000_000)  # figures that say it fitted
    assert next_pressure(0.8, generous, estimated=10, budget=100, reserve=0) == 0.8 * SHRINK
    tiny = Overflow(prompt_tokens=10**9, limit=1000)
    assert next_pressure(1.0, tiny, estimated=10, budget=1000, reserve=0) == FLOOR


def test_a_learned_window_is_the_tenants_own() -> None:
    """A window learned from one tenant's overflow fits that tenant's later requests only;
    another tenant's, and another app's, are still forwarded as unknown."""
    learned = LearnedWindows()
    window = learned.learn("alice", "m-x", Overflow(prompt_tokens=9_000, limit=8_192), 1_024)
    assert window is not None and window.max_input_tokens == 8_192
    assert learned.get("alice", "m-x") == window
    assert learned.get("bob", "m-x") is None
    assert LearnedWindows().get("alice", "m-x") is None
    assert learned.learn("alice", "m-y", Overflow(prompt_tokens=9_000), 1_024) is None


# --- what a conversation's overflows teach (issue 23, item 4) -----------------------------

DENSITY = 1.4
DENSE = "DENSE"  # marks the conversation the provider counts 1.4x what prefit estimates


class Denser:
    """A provider's count: prefit's heuristic, 1.4x for the conversation marked DENSE."""

    def count(self, messages: list[Any], tools: list[Any]) -> float:
        base = HeuristicCounter().count(messages, tools)
        return base * DENSITY if DENSE in json.dumps(messages) else base


def dense_session(turn: int) -> list[Message]:
    """A transcript under prefit's trigger (sent as it is) that the provider counts over the
    window, grown by one exchange per turn."""
    messages = agent_session(40)
    messages[1] = user(f"{TASK} {DENSE}")
    while HeuristicCounter().count(messages) > 14_800:
        messages = messages[:2] + messages[4:]
    for k in range(turn):
        messages += [assistant(f"step {k} done"), user(f"go on with step {k + 1}")]
    return messages


def test_a_conversations_overflow_teaches_its_next_turns(
    redis_url: str, tenant: str, model: str, recorder: Recorder
) -> None:
    """A conversation 1.4x denser than the tenant's settled calibration: its first request
    overflows once (retried), its next turns go through at the first attempt; a request
    that names another conversation each time learns nothing and overflows every time."""
    fake = FakeProvider(limit_tokens=WINDOW, counter=Denser())
    with serving(redis_url, tenant, model, fake, recorder) as proxy:
        for _ in range(SETTLE_AFTER):  # the tenant's calibration is settled at 1.0
            proxy.store.ratios.observe(tenant, model, 1.0)
        firsts: dict[str, list[int]] = {"same": [], "other": []}
        for turn in range(3):
            for kind in firsts:
                conv = "dense-1" if kind == "same" else f"dense-{kind}-{turn}"
                seen = len(fake.received)
                raw = openai_sdk(proxy).chat.completions.with_raw_response.create(
                    model=model,
                    messages=dense_session(turn),  # type: ignore[arg-type]
                    extra_headers={"x-prefit-conversation": conv},
                )
                assert raw.parse().choices[0].message.content == "".join(WORDS)
                firsts[kind].append(fake.received[seen].status)
    assert firsts == {"same": [400, 200, 200], "other": [400, 400, 400]}


def test_corrections_follow_the_providers_counts_per_tenant_and_conversation() -> None:
    """An overflow sets the conversation's pressure from the figures; the answers' counts
    keep it current and drop it once the estimate is not low; nothing crosses tenants."""
    memory = Corrections()
    assert memory.pressure("t1", "c") == 1.0
    memory.counted("t1", "c", 14_000, 10_000)  # no overflow yet: nothing to follow
    assert memory.pressure("t1", "c") == 1.0
    memory.overflowed("t1", "c", 14_000, 10_000)
    assert memory.pressure("t1", "c") == pytest.approx(1 / (1.02 * 1.4))
    assert memory.pressure("t2", "c") == 1.0 and memory.pressure("t1", "d") == 1.0
    memory.counted("t1", "c", 12_000, 10_000)
    assert memory.pressure("t1", "c") == pytest.approx(1 / (1.02 * 1.2))
    memory.counted("t1", "c", 9_900, 10_000)  # calibration caught up
    assert memory.pressure("t1", "c") == 1.0
