"""The Responses API through the real `openai` SDK: fitted, streamed, retried, observed."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from api.app import create_app
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.summaries.extractive import ExtractiveSummarizer
from tests.api.conftest import RESERVE, WINDOW, Recorder, key_of
from tests.api.proxy.conftest import TASK, Proxy, proxy_settings, wait_for
from tests.api.proxy.test_upstream import two_tenants
from tests.api.server import serve
from tests.fakeprovider import WORDS, FakeProvider, prompt_tokens

pytestmark = pytest.mark.anyio

INSTRUCTIONS = "You are Codex, a coding agent. Be careful."
RESPONSES_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command",
        "strict": False,
        "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": None},
    {"type": "local_shell"},
]
# the other fields Codex sends, which must go upstream unchanged
CODEX_FIELDS: dict[str, Any] = {
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0f7a-session",
}
PAIRED_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def sdk(proxy: Proxy, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key or proxy.key, max_retries=0)


def reasoning(k: int) -> dict[str, Any]:
    """A reasoning item with encrypted content unique to step `k`."""
    summary = [{"type": "summary_text", "text": f"**Checking step {k}**"}]
    return {
        "type": "reasoning",
        "id": f"rs_{k}",
        "summary": summary,
        "content": None,
        "encrypted_content": f"gAAAAABp{k:04d}" + "Zm9vYmFy+/=" * 40,
    }


def codex_session(turns: int, output_chars: int = 1200) -> list[dict[str, Any]]:
    """Input items as Codex builds them: a developer and a user message, the task, then per
    step reasoning, a shell call and its long output; apply_patch custom calls, a local
    shell pair, and some prose now and then."""
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]},
    ]
    for k in range(turns):
        items.append(reasoning(k))
        if k % 4 == 3:
            patch = f"*** Begin Patch\n*** Update File: src/cache.py\n+# step {k}\n*** End Patch"
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{k}",
                    "status": "completed",
                    "call_id": f"call_{k}",
                    "name": "apply_patch",
                    "input": patch,
                }
            )
            items.append(
                {"type": "custom_tool_call_output", "call_id": f"call_{k}", "output": "Done"}
            )
            continue
        if k % 6 == 5:
            action = {"type": "exec", "command": ["ls"], "env": {}}
            items.append(
                {
                    "type": "local_shell_call",
                    "id": f"lsh_{k}",
                    "call_id": f"call_{k}",
                    "action": action,
                    "status": "completed",
                }
            )
            items.append(
                {
                    "type": "local_shell_call_output",
                    "id": f"call_{k}",
                    "output": "cache.py\n" * 20,
                }
            )
            continue
        arguments = json.dumps({"command": ["bash", "-lc", f"grep -rn cache src/ # {k}"]})
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{k}",
                "call_id": f"call_{k}",
                "name": "shell",
                "arguments": arguments,
            }
        )
        output = f"src/cache.py:{k}: " + "lookup miss " * (output_chars // 12)
        items.append({"type": "function_call_output", "call_id": f"call_{k}", "output": output})
        if k % 5 == 4:
            text = f"step {k}: " + "still looking " * 20
            part = {"type": "output_text", "text": text, "annotations": []}
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{k}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [part],
                }
            )
            items.append({"role": "user", "content": f"status of step {k}? " + "go on " * 20})
    return items


def assert_fitted_faithfully(
    sent: list[dict[str, Any]], given: list[dict[str, Any]], *, key_order: bool = True
) -> None:
    """What went upstream is the head, then items of `given` in their order: every carried
    item byte for byte (keys in their order unless a client re-serialized them), every call
    with its output (an output maybe shortened), and only user messages (summaries) added."""

    def _key(item: dict[str, Any]) -> str:
        return json.dumps(item, sort_keys=not key_order)

    assert sent[:2] == given[:2]
    originals = {_key(item): k for k, item in enumerate(given)}
    outputs = {i["call_id"]: k for k, i in enumerate(given) if i.get("type") in PAIRED_OUTPUTS}
    positions: list[int] = []
    for item in sent:
        kind = item.get("type")
        if _key(item) in originals:
            positions.append(originals[_key(item)])
        elif kind in PAIRED_OUTPUTS:
            positions.append(outputs[item["call_id"]])  # shortened or cleared: same call
        else:
            assert item.get("role") == "user", f"an item not sent by the client: {item}"
    assert positions == sorted(positions), "items were reordered"
    calls = [i["call_id"] for i in sent if i.get("type") in ("function_call", "custom_tool_call")]
    answered = [i["call_id"] for i in sent if i.get("type") in PAIRED_OUTPUTS]
    assert calls == answered, "a call went without its output, or an output without its call"
    shell = [i["call_id"] for i in sent if i.get("type") == "local_shell_call"]
    assert shell == [i["id"] for i in sent if i.get("type") == "local_shell_call_output"]


def test_a_long_codex_session_is_fitted_keeping_reasoning_pairs_and_every_field(
    proxy: Proxy,
) -> None:
    """A session over the provider's window comes through fitted in one request: reasoning
    items (their encrypted content) byte for byte, pairs whole, the head and the last turns
    kept, instructions and every other field as the client sent them."""
    items = codex_session(60)
    body = {"instructions": INSTRUCTIONS, "tools": RESPONSES_TOOLS, **CODEX_FIELDS}
    assert prompt_tokens("responses", {**body, "input": items}) > WINDOW  # would overflow
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=items,  # type: ignore[arg-type]
        **body,
    )
    assert raw.parse().output_text == "".join(WORDS)
    assert (raw.headers["x-prefit-fit"], raw.headers["x-prefit-retries"]) == ("applied", "0")
    [got] = proxy.fake.received
    assert got.status == 200 and got.path == "/v1/responses"
    assert got.headers["authorization"] == "Bearer sk-upstream-openai"
    sent = got.body["input"]
    assert_fitted_faithfully(sent, items)
    assert sent[-4:] == items[-4:]
    assert sum(i.get("type") == "reasoning" for i in sent) >= 3
    assert {k: v for k, v in got.body.items() if k != "input"} == {"model": proxy.model, **body}
    assert prompt_tokens("responses", got.body) <= WINDOW - RESERVE


def test_a_stream_passes_through_event_by_event_and_its_usage_is_observed(
    proxy: Proxy,
) -> None:
    """Every event of the provider's stream reaches the SDK in order; the prompt count of
    `response.completed` feeds calibration."""
    proxy.fake.scale = 1.5
    events = list(
        sdk(proxy).responses.create(
            model=proxy.model,
            instructions=INSTRUCTIONS,
            input=codex_session(60),  # type: ignore[arg-type]
            tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            stream=True,
            **CODEX_FIELDS,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "".join(WORDS)
    reasoning_done = next(e.item for e in events if e.type == "response.output_item.done")
    assert reasoning_done.type == "reasoning" and reasoning_done.encrypted_content
    assert events[-1].response.usage is not None  # type: ignore[union-attr]
    wait_for(lambda: (proxy.store.ratios.get(proxy.tenant, proxy.model) or 1.0) > 1.2)


@pytest.mark.parametrize("stream", [False, True])
def test_an_overflow_is_retried_deeper_and_the_client_sees_only_the_success(
    proxy: Proxy, stream: bool
) -> None:
    """A provider counting 1.5x prefit's estimate refuses the first request with
    `context_length_exceeded`; prefit retries smaller, before any event is streamed."""
    proxy.fake.scale = 1.5
    items = codex_session(21)  # under prefit's trigger: sent whole, too long for the provider
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=items,  # type: ignore[arg-type]
        stream=stream,
    )
    answer = raw.parse()
    if stream:
        text = "".join(e.delta for e in answer if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    else:
        text = answer.output_text  # type: ignore[union-attr]
    assert text == "".join(WORDS)
    assert raw.headers["x-prefit-retries"] == "1"
    first, second = proxy.fake.received
    assert (first.status, second.status) == (400, 200)
    assert first.body["input"] == items
    assert_fitted_faithfully(second.body["input"], items)


def test_an_overflow_reported_inside_the_stream_is_retried_before_any_event(
    proxy: Proxy,
) -> None:
    """A `response.failed` with `context_length_exceeded` after `response.created` is
    read ahead, not passed on: the request is retried deeper and the client reads only the
    stream that succeeded."""
    proxy.fake.scale = 1.5
    proxy.fake.overflow_in_stream = True
    items = codex_session(21)
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=items,  # type: ignore[arg-type]
        stream=True,
    )
    events = list(raw.parse())
    assert [e.type for e in events].count("response.created") == 1
    assert "response.failed" not in [e.type for e in events]
    assert events[-1].type == "response.completed"
    assert raw.headers["x-prefit-retries"] == "1"
    assert [r.status for r in proxy.fake.received] == [400, 200]


def test_a_stream_that_fails_otherwise_is_passed_on_as_it_came(proxy: Proxy) -> None:
    """When no retry is left the failed stream reaches the client, every event of it."""
    earlier = sdk(proxy).responses.create(model=proxy.model, input="hi").id
    proxy.fake.scale = 1.5
    proxy.fake.overflow_in_stream = True
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=codex_session(21),  # type: ignore[arg-type]
        stream=True,
        previous_response_id=earlier,  # unfitted: nothing to retry with
    )
    kinds = [e.type for e in raw.parse()]
    assert kinds == ["response.created", "response.in_progress", "response.failed"]


def test_server_side_state_is_forwarded_unfitted_and_the_header_says_so(proxy: Proxy) -> None:
    """With `previous_response_id` (of a response the tenant made) the provider holds turns
    prefit cannot see: the request goes upstream exactly as sent."""
    earlier = sdk(proxy).responses.create(model=proxy.model, input="hi").id
    items = codex_session(10)
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=items,  # type: ignore[arg-type]
        previous_response_id=earlier,
    )
    assert raw.headers["x-prefit-fit"] == "skipped (server-side state: previous_response_id)"
    got = proxy.fake.received[-1]
    assert got.body == {"model": proxy.model, "input": items, "previous_response_id": earlier}


def test_an_input_prefit_cannot_read_is_forwarded_naming_the_item(proxy: Proxy) -> None:
    """An output answering no call of the turn before it: the provider judges it (its own
    400 comes back); the header names the input item at fault."""
    items = [*codex_session(3), {"type": "function_call_output", "call_id": "nope", "output": ""}]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(proxy).responses.create(model=proxy.model, input=items)  # type: ignore[arg-type]
    assert refused.value.message.endswith(
        "No tool call found for function call output with call_id nope."
    )
    fit = refused.value.response.headers["x-prefit-fit"]
    assert fit == f"skipped (invalid transcript at message {len(items) - 1})"
    assert proxy.fake.received[0].body["input"] == items


def test_a_short_string_input_goes_byte_for_byte(proxy: Proxy) -> None:
    """Under the window nothing changes: the client's exact bytes go upstream."""
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model, input="hello", instructions=INSTRUCTIONS, max_output_tokens=64
    )
    assert raw.headers["x-prefit-fit"] == "unchanged"
    [got] = proxy.fake.received
    assert got.body == {
        "model": proxy.model,
        "input": "hello",
        "instructions": INSTRUCTIONS,
        "max_output_tokens": 64,
    }


def test_max_output_tokens_is_the_replys_room_and_usage_is_observed(proxy: Proxy) -> None:
    """A request asking for a long reply is fitted to leave room for it; the answer's
    `usage.input_tokens` feeds calibration; the conversation header names the conversation."""
    proxy.fake.scale = 1.2
    raw = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        input=codex_session(40),  # type: ignore[arg-type]
        max_output_tokens=6000,
        extra_headers={"X-Prefit-Conversation": "codex-session-1"},
    )
    assert raw.headers["x-prefit-conversation"] == "codex-session-1"
    [got] = proxy.fake.received
    assert got.status == 200 and got.body["max_output_tokens"] == 6000
    assert prompt_tokens("responses", got.body) <= WINDOW - 6000
    wait_for(lambda: (proxy.store.ratios.get(proxy.tenant, proxy.model) or 1.0) > 1.1)


def test_input_tokens_are_counted_on_the_fitted_input(proxy: Proxy) -> None:
    """`input_tokens.count` answers the provider's count of what prefit would send."""
    items = codex_session(60)
    unfitted = prompt_tokens("responses", {"instructions": INSTRUCTIONS, "input": items})
    counted = sdk(proxy).responses.input_tokens.count(
        model=proxy.model,
        instructions=INSTRUCTIONS,
        input=items,  # type: ignore[arg-type]
    )
    assert counted.input_tokens <= WINDOW - RESERVE < unfitted
    [got] = proxy.fake.received
    assert got.path == "/v1/responses/input_tokens"
    assert_fitted_faithfully(got.body["input"], items)


def test_input_tokens_without_a_model_are_counted_unfitted(proxy: Proxy) -> None:
    """`model` is optional on the count: without one there is no window, so the input is
    counted as sent, not refused."""
    raw = sdk(proxy).responses.input_tokens.with_raw_response.count(input="hello there")
    assert raw.parse().input_tokens > 0
    assert raw.headers["x-prefit-fit"] == "skipped (unknown model)"
    [got] = proxy.fake.received
    assert got.body == {"input": "hello there"}


def test_stored_responses_pass_through(proxy: Proxy) -> None:
    """Retrieve, input items, cancel and delete (of a response the tenant made) reach the
    provider unchanged; a compaction that continues the provider's stored state does too
    (prefit cannot read that state); once deleted, the id is no longer the tenant's."""
    client = sdk(proxy)
    rid = client.responses.create(model=proxy.model, input="hi").id
    assert client.responses.retrieve(rid).id == rid
    assert [i.id for i in client.responses.input_items.list(rid)] == ["msg_1"]
    assert client.responses.cancel(rid).status == "cancelled"
    compacted = client.responses.with_raw_response.compact(
        model=proxy.model, previous_response_id=rid
    )
    assert compacted.parse().output[0].type == "compaction"
    assert compacted.headers["x-prefit-fit"] == "skipped (server-side state: previous_response_id)"
    client.responses.delete(rid)
    got = proxy.fake.received[1:]
    assert [(r.path, r.body.get("previous_response_id")) for r in got] == [
        (f"/v1/responses/{rid}", None),
        (f"/v1/responses/{rid}/input_items", None),
        (f"/v1/responses/{rid}/cancel", None),
        ("/v1/responses/compact", rid),
        (f"/v1/responses/{rid}", None),
    ]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(rid)
    assert len(proxy.fake.received) == 6
    assert {r.headers["authorization"] for r in got} == {"Bearer sk-upstream-openai"}


def test_prefit_errors_are_openai_errors(proxy: Proxy) -> None:
    """A wrong key, a body without a model, and a body that is not JSON are refused in
    OpenAI's error shape, so the SDK raises its usual types; nothing reaches the provider."""
    with pytest.raises(openai.AuthenticationError):
        sdk(proxy, key="not-a-prefit-key").responses.create(model=proxy.model, input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(proxy).responses.create(model="", input="hi")
    assert "'model'" in caught.value.message
    r = httpx.post(
        f"{proxy.url}/v1/responses",
        content=b"{not json",
        headers={"Authorization": f"Bearer {proxy.key}", "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        sdk(proxy).get("/responses", cast_to=httpx.Response)
    assert proxy.fake.received == []


async def test_a_summary_made_ahead_is_used_on_the_next_turn(proxy: Proxy) -> None:
    """The store holds the session as converted; once a worker's summary record exists, the
    next turn goes as [head][summary][the rest], carried items still byte for byte."""
    client = sdk(proxy)
    items = codex_session(60)
    first = client.responses.with_raw_response.create(
        model=proxy.model,
        instructions=INSTRUCTIONS,
        input=items,  # type: ignore[arg-type]
    )
    conv = first.headers["x-prefit-conversation"]
    stored = wait_for(lambda: proxy.info(conv).get("length"))
    last = proxy.store.conversations.hashes(proxy.tenant, conv)[-1]
    job = SummaryJob(proxy.tenant, conv, proxy.model, WINDOW, RESERVE, stored, last)
    done = run_job(
        job,
        store=proxy.store,
        summarizer=ExtractiveSummarizer(),
        settings=proxy.settings,
        owner="test",
    )
    assert (await done).status == "written"
    items += [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"role": "user", "content": "continue"},
    ]
    second = client.responses.with_raw_response.create(
        model=proxy.model,
        instructions=INSTRUCTIONS,
        input=items,  # type: ignore[arg-type]
    )
    assert second.headers["x-prefit-conversation"] == conv
    assert "x-prefit-summary-upto" in second.headers
    sent = proxy.fake.received[-1].body["input"]
    assert sent[2]["role"] == "user" and sent[2] not in items  # the summary
    assert_fitted_faithfully(sent, items)
    assert sent[-2:] == items[-2:]


async def _breaks_off(request: Request) -> Response:
    """An upstream that opens the stream, starts the output, then drops the connection."""

    async def events() -> AsyncIterator[bytes]:
        start = {"id": "resp_b", "object": "response", "status": "in_progress", "output": []}
        yield (
            b"event: response.created\ndata: "
            + json.dumps(
                {"type": "response.created", "response": start, "sequence_number": 0}
            ).encode()
            + b"\n\n"
        )
        item = {"type": "message", "id": "m", "role": "assistant", "content": []}
        yield (
            b"event: response.output_item.added\ndata: "
            + json.dumps(
                {"type": "response.output_item.added", "output_index": 0, "item": item}
            ).encode()
            + b"\n\n"
        )
        await asyncio.sleep(0.05)
        raise RuntimeError("the provider's connection drops")

    return StreamingResponse(events(), media_type="text/event-stream")


def test_a_stream_the_upstream_breaks_off_ends_with_an_error_event_both_clients_read(
    redis_url: str, tenant: str
) -> None:
    """The events sent arrive, then one `error` event in the Responses API's own shape
    (`type`, `code`, `message`: what Codex reads) carrying `error` (the SDK raises it)."""
    upstream = Starlette(routes=[Route("/v1/responses", _breaks_off, methods=["POST"])])
    model = f"m-{uuid.uuid4().hex[:8]}"
    with serve(upstream) as upstream_url:
        settings = proxy_settings(redis_url, model, tenant, upstream_url)
        with serve(create_app(settings, enqueue=Recorder())) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=key_of(tenant), max_retries=0)
            got: list[str] = []
            with pytest.raises(openai.APIError) as caught:
                for event in client.responses.create(model=model, input="hi", stream=True):
                    got.append(event.type)
            assert got == ["response.created", "response.output_item.added"]
            assert "broke off" in caught.value.message
            raw = httpx.post(
                f"{url}/v1/responses",
                json={"model": model, "input": "hi", "stream": True},
                headers={"Authorization": f"Bearer {key_of(tenant)}"},
            )
    last = raw.content.strip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error\ndata: ")
    data = json.loads(last.split(b"data: ", 1)[1])
    assert data["type"] == "error" and "broke off" in data["message"]
    assert data["error"]["message"] == data["message"]


def test_stored_responses_belong_to_the_tenant_that_made_them(redis_url: str, model: str) -> None:
    """alice's responses (plain and streamed) are hers: bob's retrieve, delete, input items,
    cancel, `previous_response_id` of them and `item_reference`s to their output items get
    OpenAI's not-found errors and never reach the provider; a `conversation` is refused the
    same way; alice reaches her own."""
    fake = FakeProvider()
    with two_tenants(redis_url, model, fake.app) as t:
        alice = openai.OpenAI(base_url=f"{t.url}/v1", api_key=f"key-{t.alice}", max_retries=0)
        bob = openai.OpenAI(base_url=f"{t.url}/v1", api_key=f"key-{t.bob}", max_retries=0)
        first = alice.responses.create(model=model, input="hi", store=True)
        plain, item = first.id, first.output[0].id
        with alice.responses.stream(model=model, input="hi") as events:
            final = events.get_final_response()
        streamed, streamed_item = final.id, final.output[0].id
        made = len(fake.received)
        for ref in (item, streamed_item):
            with pytest.raises(openai.BadRequestError, match="item_reference"):
                bob.responses.create(
                    model=model,
                    input=[{"type": "item_reference", "id": ref}],  # type: ignore[list-item]
                )
        for rid in (plain, streamed):
            calls = (
                bob.responses.retrieve,
                bob.responses.delete,
                bob.responses.input_items.list,
                bob.responses.cancel,
            )
            for call in calls:
                with pytest.raises(openai.NotFoundError, match=f"Response with id '{rid}'"):
                    call(rid)
            with pytest.raises(openai.BadRequestError, match="Previous response"):
                bob.responses.create(model=model, input="more", previous_response_id=rid)
        with pytest.raises(openai.BadRequestError, match="conversation"):
            bob.responses.create(model=model, input="x", conversation="conv_1")
        assert len(fake.received) == made  # nothing of bob's reached the provider
        assert alice.responses.retrieve(streamed).id == streamed
        follow = alice.responses.create(model=model, input="more", previous_response_id=plain)
        assert alice.responses.retrieve(follow.id).id == follow.id
        refs: Any = [{"type": "item_reference", "id": r} for r in (item, streamed_item)]
        wait_for(lambda: _accepted(alice, model, refs))  # a stream's items: once it ended


def _accepted(client: openai.OpenAI, model: str, refs: Any) -> bool:
    try:
        client.responses.create(model=model, input=refs)
    except openai.BadRequestError:
        return False
    return True
