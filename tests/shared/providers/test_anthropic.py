"""The Anthropic client: request mapping, answer parsing, cost, context-length errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shared.errors import ContextLengthExceeded, InvalidTranscript, LLMError
from shared.providers import AnthropicClient
from shared.providers.anthropic import API_VERSION, plain_turns
from shared.settings import Price
from tests.fakellm import Failure, FakeLLM, answer_for
from tests.shared.providers.helpers import SleepRecorder, complete, make

pytestmark = pytest.mark.anyio

PRICES = {"claude-test": Price(input=3.0, output=15.0)}


async def test_answer_usage_and_cost(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """Text from content blocks, usage from input/output tokens, cost from the price table."""
    done = await complete(
        make(AnthropicClient, fake.base_url, sleeper, prices=PRICES), model="claude-test"
    )
    prompt = fake.calls[0].prompt
    assert done.text == answer_for(prompt)
    assert done.input_tokens == len(prompt) // 4
    assert done.output_tokens == len(done.text) // 4
    assert done.cost == pytest.approx((done.input_tokens * 3.0 + done.output_tokens * 15.0) / 1e6)
    assert done.model == "claude-test"


async def test_request_shape_and_headers(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """System goes top-level; x-api-key and anthropic-version are sent; max_tokens is passed."""
    await complete(make(AnthropicClient, fake.base_url, sleeper, api_key="ak-test"), max_tokens=33)
    call = fake.calls[0]
    assert call.path == "/v1/messages"
    assert call.headers["x-api-key"] == "ak-test"
    assert call.headers["anthropic-version"] == API_VERSION
    assert "authorization" not in call.headers
    assert call.request["system"] == "You summarize conversations."
    assert call.request["max_tokens"] == 33
    assert [m["role"] for m in call.request["messages"]] == ["user"]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_with_or_without_v1(
    fake: FakeLLM, sleeper: SleepRecorder, suffix: str
) -> None:
    """`https://host` and `https://host/v1` both reach /v1/messages."""
    await complete(make(AnthropicClient, fake.root_url + suffix, sleeper))
    assert fake.calls[0].path == "/v1/messages"


def test_mapping_of_openai_messages() -> None:
    """Tool calls and results become text, same-role turns merge, empty messages are skipped."""
    system, turns = plain_turns(
        [
            {"role": "system", "content": "S1"},
            {"role": "developer", "content": "S2"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": '{"path": "."}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            {"role": "tool", "tool_call_id": "c1", "content": ""},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            {"role": "assistant", "content": None},
        ]
    )
    assert system == "S1\n\nS2"
    assert turns == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": '[tool call] ls({"path": "."})'},
        {"role": "user", "content": "[tool result]\na.py\n\n[tool result: empty]"},
        {"role": "assistant", "content": "done"},
    ]


def test_only_system_messages_is_invalid() -> None:
    """A request with nothing but system text cannot be sent to Anthropic."""
    with pytest.raises(InvalidTranscript, match="no user or assistant"):
        plain_turns([{"role": "system", "content": "S"}])


async def test_cached_input_tokens_count_as_input(sleeper: SleepRecorder) -> None:
    """Cache-creation and cache-read tokens are added to the input tokens."""
    answer = {
        "model": "claude-test",
        "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t", "name": "x", "input": {}},
        ],
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 7,
            "output_tokens": 2,
        },
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    client = make(AnthropicClient, "http://llm.test", sleeper, transport=transport)
    done = await complete(client)
    assert (done.text, done.input_tokens, done.output_tokens) == ("ok", 22, 2)


async def test_context_length_from_the_fake(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """ "prompt is too long" raises ContextLengthExceeded after one call."""
    fake.context_limit_chars = 20
    with pytest.raises(ContextLengthExceeded) as info:
        await complete(make(AnthropicClient, fake.base_url, sleeper))
    assert info.value.status == 400
    assert len(fake.calls) == 1


CONTEXT_ERRORS: list[tuple[int, Any]] = [
    (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208000 tokens > 200000 maximum",
            },
        },
    ),
    (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 198000 + 4096",
            },
        },
    ),
    (
        413,
        {
            "type": "error",
            "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"},
        },
    ),
]


@pytest.mark.parametrize(("status", "body"), CONTEXT_ERRORS)
async def test_context_length_variants(
    fake: FakeLLM, sleeper: SleepRecorder, status: int, body: Any
) -> None:
    """Anthropic's wordings of "too long" raise ContextLengthExceeded, not retried."""
    fake.script(Failure(status, body=body))
    with pytest.raises(ContextLengthExceeded):
        await complete(make(AnthropicClient, fake.base_url, sleeper))
    assert len(fake.calls) == 1


async def test_other_invalid_request_is_not_context_length(
    fake: FakeLLM, sleeper: SleepRecorder
) -> None:
    """An invalid_request_error about something else is a plain LLMError."""
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: must be positive"},
    }
    fake.script(Failure(400, body=body))
    with pytest.raises(LLMError) as info:
        await complete(make(AnthropicClient, fake.base_url, sleeper))
    assert type(info.value) is LLMError


async def test_empty_answer_names_the_stop_reason(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """An answer without text says why the model stopped."""
    fake.script(Failure(200, body={"content": [], "stop_reason": "max_tokens"}))
    with pytest.raises(LLMError, match="stop_reason=max_tokens"):
        await complete(make(AnthropicClient, fake.base_url, sleeper))
