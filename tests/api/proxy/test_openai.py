"""The OpenAI endpoint through the real `openai` SDK: fitted, retried, streamed, observed;
and its dialect's parts (the usage tap, the legacy `functions`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from api.proxy.dialects.openai import OpenAIDialect, UsageTap
from shared.counting.counters import HeuristicCounter
from shared.messages import Message, validate
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.settings import Settings
from shared.summaries.extractive import ExtractiveSummarizer
from shared.summaries.incremental import summary_message
from tests.api.conftest import RESERVE, WINDOW
from tests.api.proxy.conftest import TASK, TOOLS, Proxy, agent_session, sent_fits, wait_for
from tests.builders import assistant, call, chat, result, user
from tests.fakeprovider import WORDS, Pace, Reply

pytestmark = pytest.mark.anyio


def sdk(proxy: Proxy, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0, **kw)


def stored_length(proxy: Proxy, conv_id: str) -> int:
    return int(proxy.info(conv_id).get("length", 0))


def test_long_conversation_is_fitted_keeping_tool_pairs_task_and_every_other_field(
    proxy: Proxy,
) -> None:
    """Over the window: upstream gets a prompt that fits, pairs intact, the task first,
    every other field as the client sent it, and the deployment's key, never prefit's."""
    messages = agent_session(60)
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        temperature=0.2,
        response_format={"type": "text"},
        metadata={"run": "r1"},
        extra_body={"vendor_knob": {"x": [1, 2]}},
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == "".join(WORDS)
    assert raw.headers["x-prefit-fit"] == "applied"
    assert (
        int(raw.headers["x-prefit-tokens-before"])
        > WINDOW
        > int(raw.headers["x-prefit-tokens-after"])
    )
    [got] = proxy.fake.received
    assert got.status == 200
    sent = got.body["messages"]
    assert sent != messages and sent_fits(sent, TOOLS)
    validate(sent)  # every tool result still follows the call it answers
    assert sent[:2] == messages[:2] and sent[1]["content"] == TASK
    rest = {k: v for k, v in got.body.items() if k != "messages"}
    assert rest == {
        "model": proxy.model,
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0.2,
        "response_format": {"type": "text"},
        "metadata": {"run": "r1"},
        "vendor_knob": {"x": [1, 2]},
    }
    assert got.headers["authorization"] == "Bearer sk-upstream-openai"


def test_a_conversation_under_the_window_goes_byte_for_byte(proxy: Proxy) -> None:
    """Nothing to cut: the upstream gets the client's own body, and the answer says so."""
    messages = [{"role": "system", "content": "terse"}, user("hello")]
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-fit"] == "unchanged"
    assert raw.headers["x-prefit-tokens-before"] == raw.headers["x-prefit-tokens-after"]
    assert proxy.fake.received[0].body == {"messages": messages, "model": proxy.model}


def test_turns_sync_the_stored_conversation_by_appending_only_what_is_new(proxy: Proxy) -> None:
    """Each turn resends everything; the derived id stays, and the store follows the client."""
    client = sdk(proxy)
    messages = agent_session(10)
    first = client.chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    conv = first.headers["x-prefit-conversation"]
    assert conv.startswith("auto-")
    wait_for(lambda: stored_length(proxy, conv) == len(messages))
    messages += [assistant("".join(WORDS)), user("and now?")]
    second = client.chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert second.headers["x-prefit-conversation"] == conv
    wait_for(lambda: stored_length(proxy, conv) == len(messages))
    stored = proxy.store.conversations.read(proxy.settings.api_keys.split(":")[0], conv)
    assert stored == messages


async def test_a_summary_made_ahead_is_used_on_the_next_turn(proxy: Proxy) -> None:
    """Once the workers' record exists, the upstream gets [head][summary][rest]."""
    client = sdk(proxy)
    tenant = proxy.settings.api_keys.split(":")[0]
    messages = chat(100)  # prose: only a summary (or dropping turns) shortens it
    first = client.chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert first.headers["x-prefit-stale"] == "true"
    assert "x-prefit-summary-upto" not in first.headers
    conv = first.headers["x-prefit-conversation"]
    wait_for(lambda: stored_length(proxy, conv) == len(messages))
    await _summarize(proxy, tenant, conv, len(messages))
    messages += [assistant("".join(WORDS)), user("continue")]
    second = client.chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    upto = int(second.headers["x-prefit-summary-upto"])
    assert second.headers["x-prefit-stale"] == "false"
    sent = proxy.fake.received[-1].body["messages"]
    assert sent[:2] == messages[:2]
    record = proxy.store.records.best(tenant, conv)
    assert record is not None and record.upto == upto
    assert sent[2] == summary_message(record, 2)
    assert sent[3:] == messages[upto:]  # served as is after the summary: nothing else cut
    assert sent_fits(sent, [])


async def _summarize(proxy: Proxy, tenant: str, conv: str, length: int) -> None:
    """Write the conversation's summary record as a worker does (offline summarizer)."""
    last = proxy.store.conversations.hashes(tenant, conv)[-1]
    job = SummaryJob(tenant, conv, proxy.model, WINDOW, RESERVE, length, last)
    outcome = await run_job(
        job,
        store=proxy.store,
        summarizer=ExtractiveSummarizer(),
        settings=proxy.settings,
        owner="test",
    )
    assert outcome.status == "written"


def test_a_429_goes_back_unchanged_with_its_retry_after(proxy: Proxy) -> None:
    """Rate limits are the client's to handle: status, body and Retry-After as they came."""
    proxy.fake.script(Reply(429, headers={"retry-after": "7", "x-request-id": "req-1"}))
    with pytest.raises(openai.RateLimitError) as caught:
        sdk(proxy).chat.completions.create(
            model=proxy.model,
            messages=[user("hi")],  # type: ignore[list-item]
        )
    response = caught.value.response
    assert response.headers["retry-after"] == "7"
    assert response.headers["x-request-id"] == "req-1"
    assert response.json()["error"]["message"] == "scripted failure"
    assert len(proxy.fake.received) == 1


@pytest.mark.parametrize("status", [500, 503])
def test_a_5xx_goes_back_unchanged_and_is_not_retried(proxy: Proxy, status: int) -> None:
    """A provider failure is the client's (its SDK retries if it wants); prefit sends once."""
    proxy.fake.script(Reply(status))
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(proxy).chat.completions.create(
            model=proxy.model,
            messages=[user("hi")],  # type: ignore[list-item]
        )
    assert caught.value.status_code == status
    assert len(proxy.fake.received) == 1


def test_a_stream_arrives_intact_and_in_order_without_the_usage_chunk_prefit_asked_for(
    proxy: Proxy,
) -> None:
    """prefit asks upstream for usage (to observe it) and removes that chunk for the client."""
    chunks = list(
        sdk(proxy).chat.completions.create(
            model=proxy.model,
            messages=agent_session(60),  # type: ignore[arg-type]
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(WORDS)
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    [got] = proxy.fake.received
    assert got.body["stream_options"] == {"include_usage": True}
    assert sent_fits(got.body["messages"], [])


def test_a_client_that_asked_for_usage_gets_it(proxy: Proxy) -> None:
    """`stream_options.include_usage` from the client: its usage chunk is passed on."""
    chunks = list(
        sdk(proxy).chat.completions.create(
            model=proxy.model,
            messages=[user("hi")],  # type: ignore[list-item]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_an_unknown_model_is_forwarded_unchanged(proxy: Proxy) -> None:
    """No window configured: the request goes as it is, never refused, and nothing is kept."""
    messages = [{"role": "system", "content": "terse"}, user("hi")]
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model="some-other-model",
        messages=messages,  # type: ignore[arg-type]
        stream=False,
    )
    assert raw.headers["x-prefit-fit"] == "skipped (unknown model)"
    assert "x-prefit-conversation" not in raw.headers
    got = proxy.fake.received[0].body
    assert got == {"model": "some-other-model", "messages": messages, "stream": False}


def test_an_error_of_prefit_itself_is_shaped_for_the_sdk(proxy: Proxy) -> None:
    """A wrong key raises the SDK's AuthenticationError; a bad conversation header a 400."""
    wrong = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model=proxy.model, messages=[user("hi")])  # type: ignore[list-item]
    assert caught.value.code == "invalid_api_key"  # the SDK read prefit's error object
    assert caught.value.message.endswith(" - invalid API key")
    bad_id = sdk(proxy, default_headers={"X-Prefit-Conversation": "no spaces allowed"})
    with pytest.raises(openai.BadRequestError) as refused:
        bad_id.chat.completions.create(model=proxy.model, messages=[user("hi")])  # type: ignore[list-item]
    assert "x-prefit-conversation" in refused.value.message
    assert proxy.fake.received == []


def test_the_conversation_header_names_the_stored_conversation(proxy: Proxy) -> None:
    """`X-Prefit-Conversation` is the stored id, whatever the head."""
    client = sdk(proxy, default_headers={"X-Prefit-Conversation": "my-chat-1"})
    raw = client.chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=[user("hi")],  # type: ignore[list-item]
    )
    assert raw.headers["x-prefit-conversation"] == "my-chat-1"
    wait_for(lambda: stored_length(proxy, "my-chat-1") == 1)


def test_a_client_that_goes_away_cancels_the_upstream_stream(proxy: Proxy) -> None:
    """Closing the stream after the first event closes prefit's upstream request too."""
    proxy.fake.pace = Pace(events=0.05)
    body = {"model": proxy.model, "messages": [user("hi")], "stream": True}
    headers = {"Authorization": f"Bearer {proxy.key}"}
    with (
        httpx.Client(base_url=proxy.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        first = next(r.iter_lines())
        assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"]
    wait_for(lambda: proxy.fake.cancelled == 1)


def test_under_the_trigger_the_headers_say_what_the_stored_prepare_says(proxy: Proxy) -> None:
    """Fitted without reading the store, the figures still equal the stored prepare's."""
    messages = agent_session(20)
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    conv = raw.headers["x-prefit-conversation"]
    wait_for(lambda: stored_length(proxy, conv) == len(messages))
    prepared = httpx.post(
        f"{proxy.url}/v1/conversations/{conv}/prepare",
        json={"model": proxy.model, "tools": TOOLS},
        headers={"Authorization": f"Bearer {proxy.key}"},
    ).json()
    assert prepared["report"]["changed"] is False
    assert raw.headers["x-prefit-fit"] == "unchanged"
    assert int(raw.headers["x-prefit-tokens-before"]) == prepared["report"]["tokens_before"]
    assert int(raw.headers["x-prefit-tokens-after"]) == prepared["tokens"]


def nested_schema(levels: int) -> str:
    """A tool's JSON Schema nested `levels` objects deep (2 JSON levels each), as raw JSON:
    deeper than the stdlib encoder the client would use can write."""
    inner = '{"type":"object","properties":{"x":' * levels + '{"type":"string"}' + "}}" * levels
    return '[{"type":"function","function":{"name":"f","parameters":' + inner + "}}]"


@pytest.mark.parametrize("levels", [450, 600])
def test_deeply_nested_tools_are_fitted_or_refused_never_a_500(proxy: Proxy, levels: int) -> None:
    """Tools 900 JSON levels deep are counted and fitted; past orjson's 1,024 levels the
    body is a 400 in OpenAI's shape saying so, not a crash of the JSON fallback."""
    body = json.dumps({"model": proxy.model, "messages": [user("hi")], "tools": "T"})
    raw = body.replace('"T"', nested_schema(levels))
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {proxy.key}", "content-type": "application/json"},
    )
    if levels < 512:
        assert r.status_code == 200 and r.headers["x-prefit-fit"] == "unchanged"
        assert len(proxy.fake.received) == 1
    else:
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
        assert proxy.fake.received == []


def test_recent_turns_over_the_budget_are_still_fitted_to_the_window(proxy: Proxy) -> None:
    """Head + protected recent turns over the budget (long tool-call arguments, nothing left
    to shorten) but the head and last turn within the window: the request is fitted to the
    window, not forwarded unchanged over it."""
    messages: list[Message] = [{"role": "system", "content": "Be brief."}]
    messages.append(user(TASK + "alpha beta gamma delta " * 1400))
    for k in range(30):
        args = json.dumps({"cmd": f"cat <<EOF > f{k}.py\n" + "x = 1\n" * 1500})
        messages += [call(f"call_{k}", args=args), result(f"call_{k}", "out " * 400)]
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-fit"] == "applied"
    [got] = proxy.fake.received
    sent = got.body["messages"]
    assert HeuristicCounter().count(validate(sent), []) <= WINDOW
    assert sent[1] == messages[1] and sent[-2:] == messages[-2:]
    # a request asking for a reply gets room for it (prompt + reply within the window)
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=proxy.model,
        messages=messages,  # type: ignore[arg-type]
        max_completion_tokens=3_000,
    )
    assert raw.headers["x-prefit-fit"] == "applied"
    sent = proxy.fake.received[-1].body["messages"]
    assert HeuristicCounter().count(validate(sent), []) <= WINDOW - 3_000
    assert sent[1] == messages[1] and sent[-1] == messages[-1]


def _chunk(**fields: object) -> bytes:
    return b"data: " + json.dumps(fields).encode() + b"\n\n"


def test_the_openai_tap_reads_usage_and_drops_only_the_chunk_prefit_asked_for() -> None:
    """The usage-only chunk is read; dropped when prefit added it, kept when the client did."""
    usage = _chunk(choices=[], usage={"prompt_tokens": 42, "completion_tokens": 1})
    content = _chunk(choices=[{"delta": {"content": "hi"}}], usage=None)
    mine = UsageTap(strip=True)
    assert mine.keep(content) and not mine.keep(usage) and mine.keep(b"data: [DONE]\n\n")
    assert mine.prompt_tokens == 42
    theirs = UsageTap(strip=False)
    assert theirs.keep(usage) and theirs.prompt_tokens == 42


def test_streamed_openai_requests_ask_for_usage_once() -> None:
    """include_usage is added (other stream options kept) unless the client asked for it."""
    dialect = OpenAIDialect(Settings())
    body, strip = dialect.streamed({"stream": True, "stream_options": {"x": 1}})
    assert body == {"stream": True, "stream_options": {"x": 1, "include_usage": True}} and strip
    assert dialect.streamed({"stream_options": {"include_usage": True}}) == (None, False)


def test_legacy_functions_are_counted_as_the_tools_they_are() -> None:
    """The legacy `functions` parameter's specs take room in the prompt like `tools`."""
    fn = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    tool = {"type": "function", "function": {"name": "other", "parameters": {}}}
    body = {"messages": [user("hi")], "tools": [tool], "functions": [fn]}
    _, specs = OpenAIDialect(Settings()).transcript(body, lambda m: list(m))
    assert specs == [tool, {"type": "function", "function": fn}]
