"""The OpenAI-compatible client: request shape, answer parsing, cost, context-length errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shared.errors import ConfigError, ContextLengthExceeded, LLMError, RetryableLLMError
from shared.providers import OpenAIClient
from shared.settings import Price
from tests.fakellm import Failure, FakeLLM, answer_for
from tests.shared.providers.helpers import MESSAGES, SleepRecorder, complete, make

pytestmark = pytest.mark.anyio

PRICES = {"test-model": Price(input=2.0, output=8.0)}


async def test_answer_usage_and_cost(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """Text, token usage and cost come from the provider's answer and the price table."""
    done = await complete(make(OpenAIClient, fake.base_url, sleeper, prices=PRICES))
    prompt = fake.calls[0].prompt
    assert done.text == answer_for(prompt)
    assert done.input_tokens == len(prompt) // 4
    assert done.output_tokens == len(done.text) // 4
    assert done.cost == pytest.approx((done.input_tokens * 2.0 + done.output_tokens * 8.0) / 1e6)
    assert done.cost > 0
    assert done.model == "test-model"


async def test_request_shape(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """POST {base_url}/chat/completions with model, messages and max_tokens."""
    await complete(make(OpenAIClient, fake.base_url + "/", sleeper), max_tokens=77)
    call = fake.calls[0]
    assert call.path == "/v1/chat/completions"
    assert call.request == {"model": "test-model", "messages": MESSAGES, "max_tokens": 77}


async def test_bearer_auth_only_with_a_key(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """An API key is sent as a Bearer token; without one no Authorization header is sent."""
    await complete(make(OpenAIClient, fake.base_url, sleeper, api_key="sk-test"))
    await complete(make(OpenAIClient, fake.base_url, sleeper, api_key=None))
    with_key, without = fake.calls
    assert with_key.headers["authorization"] == "Bearer sk-test"
    assert "authorization" not in without.headers


async def test_default_model(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """model=None uses the client's default model."""
    await complete(
        make(OpenAIClient, fake.base_url, sleeper, default_model="local-llama"), model=None
    )
    assert fake.calls[0].model == "local-llama"


async def test_no_model_at_all_is_a_config_error(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """Without a model and without a default, nothing is sent."""
    with pytest.raises(ConfigError, match="PREFIT_SUMMARIZER_MODEL"):
        await complete(make(OpenAIClient, fake.base_url, sleeper), model=None)
    assert fake.calls == []


async def test_bad_max_tokens(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """max_tokens below 1 is refused before any call."""
    with pytest.raises(ConfigError, match="max_tokens"):
        await complete(make(OpenAIClient, fake.base_url, sleeper), max_tokens=0)
    assert fake.calls == []


def test_base_url_must_be_http(sleeper: SleepRecorder) -> None:
    """A base URL without an http(s) scheme is a configuration error."""
    with pytest.raises(ConfigError, match="http"):
        make(OpenAIClient, "localhost:11434/v1", sleeper)


async def test_context_length_from_the_fake(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """OpenAI's context_length_exceeded 400 raises ContextLengthExceeded after one call."""
    fake.context_limit_chars = 20
    with pytest.raises(ContextLengthExceeded) as info:
        await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert info.value.status == 400
    assert len(fake.calls) == 1
    assert sleeper.waits == []


CONTEXT_ERRORS: list[tuple[int, Any]] = [
    (
        400,
        {
            "error": {
                "message": "x",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    ),
    (
        400,
        {"error": {"message": "This model's maximum context length is 8192 tokens.", "code": None}},
    ),
    # vLLM, older versions: the fields at the top level
    (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. You requested 5000",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    # llama.cpp server
    (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
            }
        },
    ),
    (400, {"error": "Input is longer than the context window of this model"}),
    (413, "Request Entity Too Large"),
]


@pytest.mark.parametrize(("status", "body"), CONTEXT_ERRORS)
async def test_context_length_variants(
    fake: FakeLLM, sleeper: SleepRecorder, status: int, body: Any
) -> None:
    """OpenAI, vLLM, llama.cpp and proxy wordings of "too long" all raise ContextLengthExceeded."""
    fake.script(Failure(status, body=body))
    with pytest.raises(ContextLengthExceeded):
        await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert len(fake.calls) == 1


async def test_other_400_is_a_plain_llm_error(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """A 400 about something else is not mistaken for a context-length error."""
    body = {
        "error": {
            "message": "Invalid value for 'temperature'",
            "type": "invalid_request_error",
            "param": "temperature",
        }
    }
    fake.script(Failure(400, body=body))
    with pytest.raises(LLMError) as info:
        await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert type(info.value) is LLMError
    assert "param=temperature" in str(info.value)
    assert "type=invalid_request_error" in str(info.value)


async def test_request_id_is_reported(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """The provider's request id is in the message, for support tickets."""
    fake.script(Failure(403, headers={"x-request-id": "req_abc123"}))
    with pytest.raises(LLMError, match="request id req_abc123"):
        await complete(make(OpenAIClient, fake.base_url, sleeper))


@pytest.mark.parametrize(
    "body",
    [
        {
            "choices": [
                {"message": {"role": "assistant", "content": None}, "finish_reason": "length"}
            ]
        },
        {"choices": [{"message": {"role": "assistant", "content": "  "}, "finish_reason": "stop"}]},
        {"choices": []},
        {"id": "x"},
        ["not", "an", "object"],
        "not json",
    ],
)
async def test_unusable_answers(fake: FakeLLM, sleeper: SleepRecorder, body: Any) -> None:
    """Empty, malformed or non-JSON 200 answers raise LLMError and are not retried."""
    fake.script(Failure(200, body=body))
    with pytest.raises(LLMError) as info:
        await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert not isinstance(info.value, RetryableLLMError)
    assert info.value.status == 200
    assert len(fake.calls) == 1


async def test_empty_answer_names_the_finish_reason(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """An empty completion says why the model stopped."""
    body = {
        "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}]
    }
    fake.script(Failure(200, body=body))
    with pytest.raises(LLMError, match="finish_reason=length"):
        await complete(make(OpenAIClient, fake.base_url, sleeper))


async def test_missing_usage_counts_zero(sleeper: SleepRecorder) -> None:
    """Servers that report no usage give 0 tokens and 0 cost, not an error."""
    answer = {"choices": [{"message": {"role": "assistant", "content": "short"}}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    client = make(OpenAIClient, "http://llm.test/v1", sleeper, transport=transport, prices=PRICES)
    done = await complete(client)
    assert (done.text, done.input_tokens, done.output_tokens, done.cost) == ("short", 0, 0, 0.0)


async def test_reported_model_and_its_price(sleeper: SleepRecorder) -> None:
    """The model the provider reports is returned, and priced when the asked-for one is not."""
    answer = {
        "model": "gpt-4o-2024-08-06",
        "choices": [{"message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0},
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    prices = {"gpt-4o": Price(input=2.5, output=10.0)}
    client = make(OpenAIClient, "http://llm.test/v1", sleeper, transport=transport, prices=prices)
    done = await complete(client, model="my-alias")
    assert done.model == "gpt-4o-2024-08-06"
    assert done.cost == pytest.approx(2.5)


async def test_content_parts_are_joined(sleeper: SleepRecorder) -> None:
    """An answer whose content is a list of text parts is read as their concatenation."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    answer = {"choices": [{"message": {"role": "assistant", "content": parts}}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    done = await complete(make(OpenAIClient, "http://llm.test/v1", sleeper, transport=transport))
    assert done.text == "ab"
