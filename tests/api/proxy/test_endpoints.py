"""Pass-through by allow-list: a forwarded route reaches its one provider endpoint, rebuilt
from ids of the provider's form and documented query parameters; anything else is a 404 that
never reaches the provider (sent raw on the wire, as an attacker sends it)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from api.proxy.endpoints import INPUT_ITEMS, MODEL, MODELS, RESPONSE, Passage
from tests.api.conftest import Recorder
from tests.api.proxy.conftest import Proxy, serving
from tests.fakeprovider import FakeProvider


def scope(raw_path: bytes, query: bytes = b"") -> dict[str, object]:
    return {"raw_path": raw_path, "path": raw_path.decode("latin-1"), "query_string": query}


@pytest.mark.parametrize(
    ("passage", "raw", "query", "upstream"),
    [
        (MODEL, b"/v1/models/gpt-4o-2024-08-06", b"", "/models/gpt-4o-2024-08-06"),
        (MODEL, b"/v1/models/ft:gpt-4o-mini:org::abc", b"", "/models/ft:gpt-4o-mini:org::abc"),
        (MODELS, b"/v1/models", b"limit=5&evil=1&after_id=x", "/models?limit=5&after_id=x"),
        (RESPONSE, b"/v1/responses/resp_1", b"include[]=a&stream=true", None),
        (INPUT_ITEMS, b"/v1/responses/resp_1/input_items", b"order=asc&x=%2F", None),
    ],
)
def test_a_passage_rebuilds_its_endpoint_from_validated_parts(
    passage: Passage, raw: bytes, query: bytes, upstream: str | None
) -> None:
    """The upstream path is the template with the ids in, and only documented parameters,
    re-encoded."""
    found = passage.upstream(scope(raw, query))
    assert found is not None
    path, _ = found
    if upstream is not None:
        assert path == upstream
    assert "evil" not in path and "x=" not in path
    if passage is RESPONSE:
        assert path == "/responses/resp_1?include%5B%5D=a&stream=true"


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1/models/..%2Ffiles",
        b"/v1/models/..%2Ffine_tuning%2Fjobs",
        b"/v1/models/../../admin/secret",
        b"/v1/models/..",
        b"/v1/models/.",
        b"/v1/models/x%3Fevil=1",
        b"/v1/models/x%23frag",
        b"/v1/models/x%2e%2e",
        b"/v1/models/a%00b",
        b"/v1/models/a\tb",
        b"/v1/models/",
        b"/v1/models/gpt-4o/",
        b"/v1/models//gpt-4o",
        b"/v1/models/\xc3\xa9",
        b"/v1/models/" + b"x" * 300,
    ],
)
def test_anything_but_a_whole_provider_id_is_refused(raw: bytes) -> None:
    """Separators, dot segments, percent-encoding, `?`, `#`, control characters, empty or
    overlong ids: no upstream path at all."""
    assert MODEL.upstream(scope(raw)) is None


@pytest.fixture
def proxy(redis_url: str, tenant: str, model: str, recorder: Recorder) -> Iterator[Proxy]:
    """The API in front of the recording fake provider (it records every request it gets,
    on any path: a request that reached it would show)."""
    with serving(redis_url, tenant, model, FakeProvider(), recorder) as found:
        yield found


def raw_request(url: str, target: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """`GET target` sent byte for byte on a socket (no client normalizes it); (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    lines = [b"GET " + target + b" HTTP/1.1", b"Host: " + host.encode(), b"Connection: close"]
    lines += [f"{k}: {v}".encode() for k, v in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    ("target", "anthropic"),
    [
        (b"/v1/models/..%2Ffiles", False),
        (b"/v1/models/..%2Ffine_tuning%2Fjobs", False),
        (b"/v1/models/../../admin/secret", False),
        (b"/v1/responses/..", False),
        (b"/v1/responses/..%2F..%2Ffiles", False),
        (b"/v1/responses/resp_1/..%2Fcancel", False),
        (b"/v1/models/x%3Fevil=1", False),
        (b"/v1/models/..%2Fmessages%2Fbatches", True),
        (b"/v1/models/%2e%2e/messages/batches", True),
    ],
)
def test_the_issues_walks_reach_nothing(proxy: Proxy, target: bytes, anthropic: bool) -> None:
    """Each of issue 24's paths, sent raw as the tenant: a 404 in the provider's shape, and
    no request reaches the provider."""
    headers = {"Authorization": f"Bearer {proxy.key}"}
    if anthropic:
        headers["anthropic-version"] = "2023-06-01"
    status, body = raw_request(proxy.url, target, headers)
    assert status == 404, body
    assert b"error" in body
    assert proxy.fake.received == []


def test_the_documented_query_goes_up_rebuilt_and_the_rest_stays(proxy: Proxy) -> None:
    """Anthropic's model list with its paging parameters and one more: the provider gets
    the documented ones only."""
    r = httpx.get(
        f"{proxy.url}/v1/models?limit=2&after_id=m1&x-api-key=stolen",
        headers={"x-api-key": proxy.key, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200
    [got] = proxy.fake.received
    assert got.body == {"query": "limit=2&after_id=m1"}
    assert got.headers["x-api-key"] == "sk-upstream-anthropic"


def test_a_pass_through_body_must_be_strict_json(proxy: Proxy) -> None:
    """An embeddings body with `Infinity` is refused 400 (OpenAI's shape), never forwarded."""
    r = httpx.post(
        f"{proxy.url}/v1/embeddings",
        content=b'{"model": "e", "input": "x", "dimensions": Infinity}',
        headers={"Authorization": f"Bearer {proxy.key}", "content-type": "application/json"},
    )
    assert r.status_code == 400 and "Infinity" in r.json()["error"]["message"]
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=b'{"model": "m", "messages": [], "temperature": Infinity}',
        headers={"Authorization": f"Bearer {proxy.key}", "content-type": "application/json"},
    )
    assert r.status_code == 400 and "at temperature" in r.json()["error"]["message"]
    assert proxy.fake.received == []


@pytest.mark.parametrize(
    "target",
    [
        b"/v1beta/models/x%3Fevil=1:generateContent",
        b"/v1beta/models/..:generateContent",
        b"/v1beta/models/..%2F..%2Ffiles:generateContent",
        b"/v1beta/models/gem%23x:streamGenerateContent?alt=sse",
    ],
)
def test_gemini_model_ids_are_ids_too(proxy: Proxy, target: bytes) -> None:
    """Gemini's model in the path is an id of its form, or the call is refused in Gemini's
    shape before anything goes upstream."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nx-goog-api-key: " + proxy.key.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\n{}"
        )  # fmt: skip
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] in (b"400", b"404"), answer[:200]
    assert b'"status":"' in answer.replace(b" ", b"")  # Gemini's error shape
    assert proxy.fake.received == []
