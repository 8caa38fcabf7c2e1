"""What the official `openai` SDK sends and expects, beyond chat: real message shapes,
overflow wordings, and the other endpoints a client pointed at prefit calls."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import openai
import pytest

from shared.messages import validate
from tests.api.proxy.conftest import TASK, Proxy, agent_session
from tests.builders import assistant, user
from tests.fakeprovider import WORDS, Reply


def sdk(proxy: Proxy, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key or proxy.key, max_retries=0)


def test_a_refusal_and_an_sdk_dumped_answer_are_read_and_fitted(proxy: Proxy) -> None:
    """An assistant turn with `refusal` and null content, and one appended as the SDK dumps
    its answer (refusal, audio, annotations, function_call all present), are valid: the
    transcript is fitted, not forwarded whole, and those turns go upstream as they were."""
    dumped = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ],
    }
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    tail: list[dict[str, Any]] = [
        dumped,
        {"role": "tool", "tool_call_id": "x1", "content": [{"type": "text", "text": "ok"}]},
        user("delete the production database"),
        refusal,
        user("fine, just fix the cache"),
    ]
    messages = agent_session(60) + tail
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-fit"] == "applied"
    sent = proxy.fake.received[-1].body["messages"]
    validate(sent)
    assert sent[1]["content"] == TASK
    assert sent[-len(tail) :] == tail


@pytest.mark.parametrize(
    "message",
    [
        "Input tokens exceed the configured limit of 20000 tokens. Your messages resulted "
        "in 26000 tokens. Please reduce the length of the messages.",
        "prompt is too long: 26000 tokens > 20000 maximum",
    ],
)
def test_an_overflow_without_its_code_is_still_retried(proxy: Proxy, message: str) -> None:
    """A context-length error whose `code` is not `context_length_exceeded` (newer models'
    wording, Anthropic-backed compatible endpoints) is retried smaller, not passed back."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    proxy.fake.script(Reply(400, body={"error": error}))
    messages = agent_session(50)
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-retries"] == "1"
    first, second = proxy.fake.received
    assert (first.status, second.status) == (400, 200)
    assert len(str(second.body["messages"])) < len(str(first.body["messages"]))


def test_models_are_listed_and_retrieved_from_the_provider(proxy: Proxy) -> None:
    """`models.list()` and `models.retrieve()` reach the provider with the deployment's key;
    a wrong prefit key is an `AuthenticationError`, as on chat."""
    listed = sdk(proxy).models.list()
    assert [m.id for m in listed.data] == ["fake-model"]
    assert sdk(proxy).models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
    got = proxy.fake.received
    assert [r.headers["authorization"] for r in got] == ["Bearer sk-upstream-openai"] * 2
    with pytest.raises(openai.AuthenticationError):
        sdk(proxy, key="not-a-prefit-key").models.list()


def test_the_anthropic_sdk_lists_anthropics_models(proxy: Proxy) -> None:
    """The same path with `anthropic-version` goes to the Anthropic upstream."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    [got] = proxy.fake.received
    assert got.protocol == "anthropic" and got.headers["x-api-key"] == "sk-upstream-anthropic"


def test_embeddings_pass_through_unchanged(proxy: Proxy) -> None:
    """Frameworks embed through the same base URL: the request and answer pass as they are."""
    out = sdk(proxy).embeddings.create(model="text-embedding-3-small", input="hello")
    assert out.data[0].embedding == [0.5, -0.25]
    [got] = proxy.fake.received
    assert got.body["input"] == "hello" and got.body["model"] == "text-embedding-3-small"


def test_an_endpoint_prefit_does_not_serve_is_a_not_found_that_says_so(proxy: Proxy) -> None:
    """Legacy and stored chat completions: `NotFoundError` naming what prefit serves."""
    with pytest.raises(openai.NotFoundError) as caught:
        sdk(proxy).completions.create(model=proxy.model, prompt="hi")
    assert "/v1/responses" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        sdk(proxy).chat.completions.list()  # stored completions
    with pytest.raises(openai.NotFoundError):
        sdk(proxy).chat.completions.retrieve("chatcmpl-1")
    assert proxy.fake.received == []


def test_an_unknown_models_window_is_learned_from_its_overflow(proxy: Proxy) -> None:
    """A model left out of PREFIT_MODELS goes unfitted until the provider states its
    maximum: that request is fitted to it and retried, and the next turns are fitted to it
    from the start, pairs and task kept."""
    model = f"unconfigured-{uuid.uuid4().hex[:8]}"
    proxy.fake.limit_tokens = 8_000
    messages = agent_session(60)
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert (raw.headers["x-prefit-fit"], raw.headers["x-prefit-retries"]) == ("applied", "1")
    assert [r.status for r in proxy.fake.received] == [400, 200]
    messages += [assistant("".join(WORDS)), user("go on")]
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert (raw.headers["x-prefit-fit"], raw.headers["x-prefit-retries"]) == ("applied", "0")
    assert [r.status for r in proxy.fake.received] == [400, 200, 200]
    sent = proxy.fake.received[-1].body["messages"]
    validate(sent)
    assert sent[1]["content"] == TASK and sent[-1] == messages[-1]


def test_an_upstream_that_refuses_stream_options_gets_the_stream_as_the_client_sent_it(
    proxy: Proxy,
) -> None:
    """prefit asks for the usage chunk; an upstream that rejects `stream_options` (older
    Azure API versions) gets the request again without it, and the client its stream."""
    error = {
        "message": "Unrecognized request argument supplied: stream_options",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    proxy.fake.script(Reply(400, body={"error": error}))
    stream = sdk(proxy).chat.completions.create(
        model=proxy.model,
        messages=agent_session(60),  # type: ignore[arg-type]
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(WORDS)
    first, second = proxy.fake.received
    assert first.status == 400 and first.body["stream_options"] == {"include_usage": True}
    assert second.status == 200 and "stream_options" not in second.body
