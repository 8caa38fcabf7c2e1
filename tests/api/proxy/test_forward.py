"""The proxy's other endpoints (api/proxy/forward.py): model lists, and what it refuses."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.api.proxy.conftest import Proxy
from tests.api.proxy.test_anthropic import sdk
from tests.builders import user


def test_models_list_is_the_providers(proxy: Proxy) -> None:
    """`models.list()` and `models.retrieve()` reach Anthropic's model list with the
    deployment's key; a wrong prefit key is an AuthenticationError."""
    assert [m.id for m in sdk(proxy).models.list()] == ["fake-model"]
    got = proxy.fake.received[0]
    assert (got.path, got.protocol) == ("/v1/models", "anthropic")
    assert got.headers["x-api-key"] == "sk-upstream-anthropic"
    wrong = anthropic.Anthropic(base_url=proxy.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.models.list()


def test_message_batches_get_an_anthropic_not_found(proxy: Proxy) -> None:
    """Batches are not proxied: the SDK raises NotFoundError with Anthropic's error body."""
    request = {
        "custom_id": "a",
        "params": {"model": proxy.model, "max_tokens": 5, "messages": [user("hi")]},
    }
    with pytest.raises(anthropic.NotFoundError) as caught:
        sdk(proxy).messages.batches.create(requests=[request])  # type: ignore[list-item]
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "batches" in caught.value.body["error"]["message"]  # type: ignore[index]
    assert proxy.fake.received == []


def test_models_list_without_anthropic_version_is_openais(proxy: Proxy) -> None:
    """The OpenAI SDK's `models.list()` reaches OpenAI's list with the deployment's key."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    got = proxy.fake.received[0]
    assert (got.path, got.protocol) == ("/v1/models", "openai")
    assert got.headers["authorization"] == "Bearer sk-upstream-openai"
