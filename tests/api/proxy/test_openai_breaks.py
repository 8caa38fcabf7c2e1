"""An upstream that stalls or breaks off, as the `openai` SDK sees it through the proxy."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from api.app import create_app
from tests.api.conftest import Recorder, key_of
from tests.api.proxy.conftest import proxy_settings
from tests.api.server import serve
from tests.builders import chat

CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
CHUNK += b'"choices":[{"index":0,"delta":{"content":"half an "},"finish_reason":null}]}\n\n'


async def _breaks(request: Request) -> Response:
    async def events() -> AsyncIterator[bytes]:
        yield CHUNK
        await asyncio.sleep(0.05)
        raise RuntimeError("the provider's connection drops")

    return StreamingResponse(events(), media_type="text/event-stream")


async def _stalls(request: Request) -> Response:
    await asyncio.sleep(1.0)
    return Response(b"{}", media_type="application/json")


@pytest.fixture
def client(redis_url: str, tenant: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """An SDK client on the proxy, in front of an upstream that runs `request.param`."""
    upstream = Starlette(routes=[Route("/v1/chat/completions", request.param, methods=["POST"])])
    model = f"m-{uuid.uuid4().hex[:8]}"
    with serve(upstream) as upstream_url:
        settings = proxy_settings(
            redis_url, model, tenant, upstream_url, upstream_read_timeout_s=0.3
        )
        with serve(create_app(settings, enqueue=Recorder())) as url:
            sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key_of(tenant), max_retries=0)
            yield sdk, model


@pytest.mark.parametrize("client", [_breaks], indirect=True)
def test_a_stream_the_upstream_breaks_off_raises_instead_of_ending_quietly(
    client: Any,
) -> None:
    """The events sent arrive, then an `error` event: the SDK raises `APIError`, so a cut
    answer is never taken for a whole one."""
    sdk, model = client
    got: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in sdk.chat.completions.create(model=model, messages=chat(1), stream=True):
            got.append(chunk.choices[0].delta.content or "")
    assert got == ["half an "]
    assert "broke off" in caught.value.message


@pytest.mark.slow
@pytest.mark.parametrize("client", [_stalls], indirect=True)
def test_an_upstream_that_times_out_is_a_504_the_sdk_raises(client: Any) -> None:
    """No byte within the read timeout: `InternalServerError` 504, in OpenAI's shape."""
    sdk, model = client
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model=model, messages=chat(1))
    assert caught.value.status_code == 504 and "timed out" in caught.value.message
