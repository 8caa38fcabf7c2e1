"""The Gemini API through the real google-genai SDK: fitted, streamed, counted, retried,
observed; signed model turns kept whole; keys and errors as Gemini has them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from api.proxy.dialects.gemini import GeminiDialect, UsageMetadataTap, keyed
from shared.formats.gemini import from_gemini
from shared.settings import Settings
from tests.api.conftest import WINDOW
from tests.api.proxy.conftest import TASK, Proxy, sent_fits, wait_for
from tests.fakeprovider import WORDS, Reply, gemini_signature, gemini_tokens

SYSTEM = "You are Gemini CLI, an interactive agent that fixes code. Be careful."
DECLARATIONS = [
    {
        "name": "run_shell_command",
        "description": "Runs a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


@pytest.fixture
def model() -> str:
    """A Gemini 3 model name no other test uses: the fake checks its thought signatures."""
    return f"gemini-3-pro-{uuid.uuid4().hex[:8]}"


def cli_session(turns: int, output_chars: int = 1200) -> list[dict[str, Any]]:
    """A Gemini CLI transcript: the task, then signed function calls (a thought first, the
    signature on the call) and long outputs, some turns with two calls in parallel."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": TASK}]}]
    for k in range(turns):
        calls = [{"name": "run_shell_command", "args": {"command": f"grep -rn cache src/ #{k}"}}]
        if k % 3 == 2:
            calls.append({"name": "run_shell_command", "args": {"command": f"ls src/{k}"}})
        parts: list[dict[str, Any]] = [{"text": f"Looking at step {k}.", "thought": True}]
        parts.append({"functionCall": calls[0], "thoughtSignature": gemini_signature(calls[0])})
        parts += [{"functionCall": c} for c in calls[1:]]
        contents.append({"role": "model", "parts": parts})
        output = f"src/cache.py:{k}: " + "lookup miss " * (output_chars // 12)
        contents.append(
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": c["name"], "response": {"output": output}}}
                    for c in calls
                ],
            }
        )
    return contents


@pytest.fixture
def sdk(proxy: Proxy) -> Iterator[genai.Client]:
    """The google-genai client pointed at prefit, as the test's tenant (closed after: the
    client closes its connections when collected, so it is held for the whole test)."""
    with client(proxy) as found:
        yield found


def client(proxy: Proxy, key: str | None = None) -> genai.Client:
    options = types.HttpOptions(
        base_url=proxy.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key=key or proxy.key, http_options=options)


def config(**extra: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[types.Tool(function_declarations=DECLARATIONS)],  # type: ignore[arg-type]
        max_output_tokens=512,
        **extra,
    )


def assert_fitted_faithfully(
    proxy: Proxy, sent: dict[str, Any], given: list[dict[str, Any]]
) -> None:
    """What went upstream: under the window, the task first, the latest tool output last,
    every model turn it kept exactly as given (thoughts, signatures) with all its
    responses, the system instruction and the tools as the SDK sent them."""
    contents = sent["contents"]
    assert contents[0] == given[0] and contents[-1] == given[-1]
    assert len(contents) <= len(given) and contents != given
    for n, content in enumerate(contents):
        if content["role"] == "model":
            assert content in given  # whole, as given
            at = given.index(content)
            assert contents[n + 1]["parts"][0]["functionResponse"]["name"] == "run_shell_command"
            assert len(contents[n + 1]["parts"]) == len(given[at + 1]["parts"])
    assert sent["systemInstruction"] == {"parts": [{"text": SYSTEM}], "role": "user"}
    [tools] = sent["tools"]  # as the SDK writes them (its types upper-cased): as it sent them
    assert [d["name"] for d in tools["functionDeclarations"]] == ["run_shell_command"]
    messages = from_gemini(sent["systemInstruction"], contents)
    assert sent_fits(messages, [{"type": "function", "function": d} for d in DECLARATIONS])


def test_generate_content_is_fitted_keeping_signed_turns_whole(
    proxy: Proxy, sdk: genai.Client
) -> None:
    """The SDK's generate_content: the long session goes up fitted, the deployment's key in
    `x-goog-api-key` (never prefit's), every other field as sent; the fake (which refuses a
    Gemini 3 call whose signature is gone or responses that do not pair) answers 200."""
    contents = cli_session(40)
    assert gemini_tokens({"contents": contents}) > WINDOW
    answer = sdk.models.generate_content(
        model=proxy.model, contents=contents, config=config(temperature=0.2)
    )
    assert answer.text == "".join(WORDS)
    assert answer.sdk_http_response is not None
    headers = answer.sdk_http_response.headers or {}
    assert headers["x-prefit-fit"] == "applied" and headers["x-prefit-retries"] == "0"
    [got] = proxy.fake.received
    assert got.status == 200 and got.path.endswith(f"/models/{proxy.model}:generateContent")
    assert_fitted_faithfully(proxy, got.body, contents)
    assert got.body["generationConfig"] == {"temperature": 0.2, "maxOutputTokens": 512}
    assert got.headers["x-goog-api-key"] == "upstream-gemini-key"
    assert proxy.key not in json.dumps(got.headers)


def test_a_stream_arrives_whole_and_its_last_usage_is_observed(
    proxy: Proxy, sdk: genai.Client
) -> None:
    """`:streamGenerateContent?alt=sse` chunk by chunk; the provider's prompt count (the last
    chunk's `usageMetadata`) calibrates prefit: the fake counts 1.5x prefit's estimate."""
    proxy.fake.scale = 1.5
    contents = cli_session(30)
    chunks = list(
        sdk.models.generate_content_stream(model=proxy.model, contents=contents, config=config())
    )
    assert "".join(c.text or "" for c in chunks) == "".join(WORDS)
    assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == "STOP"
    got = proxy.fake.received[-1]
    assert got.path.endswith(":streamGenerateContent") and got.status == 200
    wait_for(lambda: (proxy.store.ratios.get(proxy.tenant, proxy.model) or 1.0) > 1.2)


def test_an_overflow_is_retried_deeper_and_never_reaches_the_client(
    proxy: Proxy, sdk: genai.Client
) -> None:
    """The provider counts twice what prefit estimates and refuses the fitted prompt with its
    400 INVALID_ARGUMENT "input token count (N) exceeds the maximum (M)": prefit fits again
    deeper, sends a smaller prompt, and the client sees only the 200."""
    proxy.fake.scale = 2.0  # the provider counts twice what prefit estimates
    contents = cli_session(20, output_chars=10_000)  # recent outputs the fit keeps are long
    answer = sdk.models.generate_content(model=proxy.model, contents=contents, config=config())
    assert answer.text == "".join(WORDS)
    refused, sent = proxy.fake.received[-2:]
    assert (refused.status, sent.status) == (400, 200)
    assert gemini_tokens(sent.body) < gemini_tokens(refused.body)
    headers = answer.sdk_http_response.headers or {} if answer.sdk_http_response else {}
    assert headers["x-prefit-retries"] == "1"
    kept = sent.body["contents"]  # deep enough that the latest output itself is shortened
    assert kept[0] == contents[0] and kept[-2] == contents[-2]  # the task; the signed call
    assert all(c in contents for c in kept if c["role"] == "model")
    latest = kept[-1]["parts"][0]["functionResponse"]["response"]["output"]
    assert latest.startswith("src/cache.py:19: lookup miss")


def test_count_tokens_counts_the_contents_prefit_would_send(
    proxy: Proxy, sdk: genai.Client
) -> None:
    """`:countTokens` is fitted as generateContent is, then counted by the provider."""
    contents = cli_session(40)
    counted = sdk.models.count_tokens(model=proxy.model, contents=contents)
    [got] = proxy.fake.received
    assert got.path.endswith(":countTokens") and got.body["contents"] != contents
    assert counted.total_tokens == gemini_tokens(got.body) < WINDOW


def test_the_key_may_come_in_the_query_and_is_never_sent_on(proxy: Proxy) -> None:
    """The REST API's `?key=`: it names the tenant; upstream gets the deployment's key in the
    header and a query without it (`alt=sse` kept)."""
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    url = f"{proxy.url}/v1beta/models/{proxy.model}:streamGenerateContent?alt=sse&key={proxy.key}"
    with httpx.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(lines[-1][6:])["usageMetadata"]["promptTokenCount"] > 0
    [got] = proxy.fake.received
    assert got.headers["x-goog-api-key"] == "upstream-gemini-key"
    assert proxy.key not in json.dumps(got.headers) and proxy.key not in got.path


def test_prefits_errors_are_geminis_errors(proxy: Proxy) -> None:
    """A wrong key, a body that is not JSON, a version Gemini has not: the SDK's own error
    types, with Gemini's `code` and `status`."""
    with client(proxy, key="wrong") as wrong, pytest.raises(errors.ClientError) as caught:
        wrong.models.generate_content(model=proxy.model, contents="hi")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    path = f"{proxy.url}/v1beta/models/{proxy.model}:generateContent"
    r = httpx.post(path, content=b"{nope", headers={"x-goog-api-key": proxy.key})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    r = httpx.post(f"{proxy.url}/v9/models/m:generateContent", headers={"x-goog-api-key": "k"})
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    assert proxy.fake.received == []


def test_a_provider_error_comes_back_as_it_came(proxy: Proxy, sdk: genai.Client) -> None:
    """A 429 of the provider is the client's 429, body and all (no retry: not an overflow)."""
    proxy.fake.script(Reply(429))
    with pytest.raises(errors.ClientError) as caught:
        sdk.models.generate_content(model=proxy.model, contents="hi")
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    assert len(proxy.fake.received) == 1


def test_a_gemini_cli_session_is_one_conversation(proxy: Proxy, sdk: genai.Client) -> None:
    """Turn after turn the session resends its contents with more appended: one stored
    conversation, however the fit cuts it."""
    contents = cli_session(45)
    ids = set()
    for k in (20, 30, 45):
        answer = sdk.models.generate_content(
            model=proxy.model, contents=contents[: 1 + 2 * k], config=config()
        )
        assert answer.sdk_http_response is not None
        ids.add((answer.sdk_http_response.headers or {})["x-prefit-conversation"])
    assert len(ids) == 1
    assert all(r.status == 200 for r in proxy.fake.received)


def test_the_dialect_reads_the_call_from_the_path() -> None:
    """The model and the stream are in the path; the query goes on without the key."""
    dialect = GeminiDialect(Settings())
    asked = dialect.asked(
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "alt=sse&key=s", {}
    )
    assert (asked.model, asked.stream) == ("gemini-2.5-pro", True)
    assert asked.endpoint == "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    assert dialect.asked("/v1/models/m:generateContent", "", {}).endpoint == (
        "/v1/models/m:generateContent"
    )
    assert keyed({"X-Other": "1"}, "key=abc") == {"x-other": "1", "x-goog-api-key": "abc"}
    assert keyed({"x-goog-api-key": "h"}, "key=q")["x-goog-api-key"] == "h"


def test_the_dialect_reads_overflows_usage_and_counts() -> None:
    """The overflow's figures (in a list of one too), the last chunk's prompt count, the
    count-tokens answer; a 400 of another kind is no overflow."""
    dialect = GeminiDialect(Settings())
    message = (
        "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
    )
    found = dialect.overflow(400, [{"error": {"code": 400, "message": message}}])
    assert found is not None and (found.prompt_tokens, found.limit) == (1200293, 1048576)
    assert dialect.overflow(400, {"error": {"message": "API key not valid"}}) is None
    assert dialect.overflow(429, {"error": {"message": message}}) is None
    tap = UsageMetadataTap()
    for n in (10, 12):
        assert tap.keep(f'data: {{"usageMetadata": {{"promptTokenCount": {n}}}}}\r\n\r\n'.encode())
    assert tap.prompt_tokens == 12
    assert dialect.counted({"totalTokens": 31}) == 31
    assert dialect.prompt_tokens({"usageMetadata": {"promptTokenCount": 7}}) == 7
    assert dialect.error(503, "x") == {
        "error": {"code": 503, "message": "x", "status": "UNAVAILABLE"}
    }
