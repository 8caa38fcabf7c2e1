"""The proxy's routes besides the fitted ones: provider endpoints passed through (model
lists) or refused, and routes nobody serves (a 404 in the caller's API's error shape that
says what prefit serves)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.api.proxy.conftest import Proxy
from tests.api.proxy.test_anthropic import sdk
from tests.builders import user


def send(proxy: Proxy, method: str, path: str, **headers: str) -> httpx.Response:
    """`method path` with the tenant's key and a small JSON body."""
    return httpx.request(
        method,
        f"{proxy.url}{path}",
        headers={"Authorization": f"Bearer {proxy.key}", **headers},
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        timeout=10,
    )


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1beta/models/gemini-2.5-pro:embedContent", {}),
        ("/upload/v1beta/files", {}),
        ("/v9/models/gemini-2.5-pro:generateContent", {}),
        ("/v2/anything", {"x-goog-api-key": "k"}),
    ],
)
def test_gemini_calls_get_geminis_error_shape(
    proxy: Proxy, path: str, headers: dict[str, str]
) -> None:
    """Gemini calls prefit does not serve get `{"error": {"code": 404, "message", "status":
    "NOT_FOUND"}}` (generateContent and countTokens are served: tests/api/proxy/test_gemini.py)."""
    r = send(proxy, "POST", path, **headers)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == 404 and error["status"] == "NOT_FOUND"
    assert "/v1/chat/completions" in error["message"] and "/v1/messages" in error["message"]
    assert proxy.fake.received == []


def test_openai_and_anthropic_endpoints_get_their_sdks_errors(proxy: Proxy) -> None:
    """The SDKs raise their NotFoundError, whose message names what prefit serves."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.files.list()
    assert "/v1/chat/completions" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client.images.generate(prompt="a cat")
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as found:
        claude.beta.files.list()  # GET /v1/files, told Anthropic's by its version header
    assert found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "/v1/messages" in str(found.value.message)


def test_other_routes_get_prefits_shape_and_methods_stay_405(proxy: Proxy) -> None:
    """An unknown path is prefit's own NotFound naming the routes; a known path with another
    method is still 405, with the methods it takes in `Allow`."""
    r = send(proxy, "GET", "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound"
    assert "/v1/prepare" in r.json()["error"]["message"]
    r = send(proxy, "GET", "/v1/prepare")
    assert (r.status_code, r.headers.get("allow")) == (405, "POST")
    r = send(proxy, "POST", "/v1/conversations/c")
    assert (r.status_code, r.headers.get("allow")) == (405, "DELETE, GET, HEAD, PUT")
    r = send(proxy, "DELETE", "/healthz")
    assert (r.status_code, r.headers.get("allow")) == (405, "GET, HEAD")
    assert send(proxy, "GET", "/healthz").status_code == 200


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
