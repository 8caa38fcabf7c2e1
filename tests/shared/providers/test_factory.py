"""client_from_settings: which client, with which timeouts, retries and prices."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import SecretStr

from shared.providers import AnthropicClient, OpenAIClient, ProviderClient, client_from_settings
from shared.settings import Price, Settings
from shared.summaries.llm import Completion
from tests.fakellm import FakeLLM
from tests.shared.providers.helpers import SleepRecorder

pytestmark = pytest.mark.anyio


def test_no_url_means_no_client() -> None:
    """Without summarizer_url there is no provider (the extractive summarizer is used)."""
    assert client_from_settings(Settings(summarizer_url=None)) is None
    assert client_from_settings(Settings(summarizer_url="")) is None


def test_openai_client_from_settings() -> None:
    """The OpenAI protocol gives an OpenAIClient with the configured knobs."""
    settings = Settings(
        summarizer_url="http://127.0.0.1:11434/v1",
        summarizer_api_key=SecretStr("sk-x"),
        summarizer_model="llama3",
        summarizer_timeout_s=42.0,
        summarizer_connect_timeout_s=3.0,
        summarizer_max_attempts=7,
        summarizer_max_inline_wait_s=2.5,
        prices={"llama3": Price(input=1.0, output=2.0)},
        worker_concurrency=300,
    )
    client = client_from_settings(settings)
    assert isinstance(client, OpenAIClient)
    assert client.base_url == "http://127.0.0.1:11434/v1"
    assert client.default_model == "llama3"
    assert client.policy.max_attempts == 7
    assert client.policy.max_inline_wait_s == 2.5
    assert client.prices.cost("llama3", 1_000_000, 0) == 1.0
    timeout = client.pool.timeout
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (3.0, 42.0, 42.0, 42.0)
    assert client.pool.max_connections == 300


def test_anthropic_client_from_settings() -> None:
    """The Anthropic protocol gives an AnthropicClient rooted at the host."""
    settings = Settings(
        summarizer_url="https://api.anthropic.com/v1", summarizer_protocol="anthropic"
    )
    client = client_from_settings(settings)
    assert isinstance(client, AnthropicClient)
    assert client.base_url == "https://api.anthropic.com"


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
async def test_configured_client_works_end_to_end(protocol: Literal["openai", "anthropic"]) -> None:
    """A client built from settings talks to the fake with the configured key and model."""
    with FakeLLM() as fake:
        settings = Settings(
            summarizer_url=fake.base_url,
            summarizer_protocol=protocol,
            summarizer_api_key=SecretStr("secret-key"),
            summarizer_model="m-1",
        )
        client = client_from_settings(settings, sleep=SleepRecorder())
        assert client is not None
        done = await _one_call(client)
        call = fake.calls[0]
    assert done.text.startswith("SUMMARY ")
    assert call.model == "m-1"
    header = "x-api-key" if protocol == "anthropic" else "authorization"
    assert "secret-key" in call.headers[header]


async def _one_call(client: ProviderClient) -> Completion:
    try:
        return await client.complete(
            [{"role": "user", "content": "hello"}], model=None, max_tokens=5
        )
    finally:
        await client.aclose()
