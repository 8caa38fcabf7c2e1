"""POST /v1/responses/compact answered by prefit, and its compaction items expanded after."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession

from api.proxy.compaction import HEADER, MARK, Sealed, seal, sealing_key, unseal
from shared.formats.responses import from_responses
from shared.service.jobs import SummaryJob
from shared.service.precompute import run_job
from shared.store import keys
from shared.summaries.extractive import ExtractiveSummarizer
from tests.api.conftest import RESERVE, WINDOW, Recorder, key_of
from tests.api.proxy.conftest import TASK, Proxy, serving, wait_for
from tests.api.proxy.test_responses import INSTRUCTIONS, codex_session, sdk
from tests.fakeprovider import FakeProvider

pytestmark = pytest.mark.anyio

SUMMARY = "[Summary of messages"


@pytest.fixture
def model() -> str:
    """An OpenAI-style model name (the Agents SDK compacts only with those), unique."""
    return f"gpt-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def fake() -> FakeProvider:
    """An upstream without OpenAI's compaction: its /v1/responses/compact is a 404 and it
    refuses a `compaction` input item."""
    return FakeProvider(limit_tokens=20_000, compaction=False)


# the first turn of a 60-turn session is read, converted and counted from nothing: on a loaded
# 2-core machine that passed the 2 s request deadline, which is not what these tests check
SLOW_OK = {"request_deadline_s": 10.0}


@pytest.fixture
def proxy(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder
) -> Iterator[Proxy]:
    """prefit in front of the upstream without compaction, as the test's tenant."""
    with serving(redis_url, tenant, model, fake, recorder, **SLOW_OK) as p:
        yield p


async def summarized(
    proxy: Proxy, items: list[dict[str, Any]], instructions: str | None = INSTRUCTIONS
) -> str:
    """Send `items` as a turn, then run the summary job a worker would run for it; the
    conversation's id."""
    first = sdk(proxy).responses.with_raw_response.create(
        model=proxy.model,
        instructions=instructions,
        input=items,  # type: ignore[arg-type]
    )
    conv = first.headers["x-prefit-conversation"]
    stored = wait_for(lambda: proxy.info(conv).get("length"))
    last = proxy.store.conversations.hashes(proxy.tenant, conv)[-1]
    job = SummaryJob(proxy.tenant, conv, proxy.model, WINDOW, RESERVE, stored, last)
    done = await run_job(
        job,
        store=proxy.store,
        summarizer=ExtractiveSummarizer(),
        settings=proxy.settings,
        owner="test",
    )
    assert done.status == "written"
    return conv


def compact(proxy: Proxy, items: list[Any], key: str | None = None) -> httpx.Response:
    """`client.responses.compact` through prefit, the raw answer."""
    raw = sdk(proxy, key).responses.with_raw_response.compact(
        model=proxy.model,
        instructions=INSTRUCTIONS,
        input=items,
    )
    return raw.http_response


def turn(proxy: Proxy, items: list[Any], key: str | None = None) -> httpx.Response:
    """`POST /v1/responses` of `items` through prefit (httpx: the SDK would raise on a 400)."""
    body = {"model": proxy.model, "instructions": INSTRUCTIONS, "input": items}
    headers = {"Authorization": f"Bearer {key or proxy.key}"}
    return httpx.post(f"{proxy.url}/v1/responses", json=body, headers=headers, timeout=30)


def texts(items: list[dict[str, Any]]) -> list[str]:
    """The text of every message item (string or parts)."""
    out = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return out


async def test_a_summary_made_ahead_answers_the_compaction_and_the_next_turns_expand_it(
    proxy: Proxy,
) -> None:
    """With a record ready, the SDK's compact is answered by prefit (the upstream has no such
    endpoint and never hears of it): the head, one sealed compaction item, the recent items;
    no tokens billed. Every later turn goes upstream with the summary in the item's place,
    also after the store was synced to the compacted transcript, and keeps the task."""
    items = codex_session(60)
    conv = await summarized(proxy, items)
    client = sdk(proxy)
    answer = client.responses.with_raw_response.compact(
        model=proxy.model,
        instructions=INSTRUCTIONS,
        input=items,  # type: ignore[arg-type]
    )
    compacted = answer.parse()
    assert answer.headers[HEADER] == "summary"
    assert int(answer.headers["x-prefit-tokens-after"]) < int(
        answer.headers["x-prefit-tokens-before"]
    )
    assert compacted.object == "response.compaction" and compacted.usage.total_tokens == 0
    output = answer.http_response.json()["output"]
    at = next(i for i, item in enumerate(output) if item["type"] == "compaction")
    assert output[:at] == items[:2]  # the developer message and the task, as sent
    assert output[at]["encrypted_content"].startswith(MARK)
    rest = output[at + 1 :]
    assert rest and rest == items[len(items) - len(rest) :]
    assert [r.path for r in proxy.fake.received] == ["/v1/responses"]

    history = [*output, {"role": "user", "content": "continue"}]
    for k in range(2):
        r = turn(proxy, history)
        assert r.status_code == 200 and r.headers[HEADER] == "expanded"
        assert r.headers["x-prefit-conversation"] == conv
        sent = proxy.fake.received[-1].body["input"]
        assert all(item.get("type") != "compaction" for item in sent)
        assert any(t.startswith(SUMMARY) for t in texts(sent)) and TASK in texts(sent)
        assert sent[-1] == history[-1]
        synced = len(from_responses(INSTRUCTIONS, sent))  # sent whole: under the trigger
        wait_for(lambda n=synced: proxy.info(conv).get("length") == n)  # replaced
        history += [
            {"role": "assistant", "content": f"step {k} done"},
            {"role": "user", "content": f"go on {k}"},
        ]


def test_without_a_summary_the_compaction_is_the_cheap_fit_and_asks_for_the_summary(
    proxy: Proxy, recorder: Recorder
) -> None:
    """No record yet: the answer is the transcript as prefit fits it (no compaction item, no
    model call, the task kept) and the summary job is sent; under the trigger, fitted as if
    the window were the transcript's own size (the client wants it smaller); what nothing
    can shorten (the recent turns only) comes back as it was."""
    items = codex_session(60)
    r = compact(proxy, items)
    assert r.status_code == 200 and r.headers[HEADER] == "cheap"
    output = r.json()["output"]
    assert all(item["type"] != "compaction" for item in output if "type" in item)
    assert output[:2] == items[:2] and len(str(output)) < len(str(items))
    assert proxy.fake.received == []
    wait_for(lambda: recorder.jobs)
    under = codex_session(20)
    r = compact(proxy, under)
    assert r.headers["x-prefit-fit"] == "compacted (cheap)"
    assert int(r.headers["x-prefit-tokens-after"]) < int(r.headers["x-prefit-tokens-before"])
    assert r.json()["output"][:2] == under[:2] and r.json()["output"][-1] == under[-1]
    short = codex_session(2)
    r = compact(proxy, short)
    assert r.headers[HEADER] == "unchanged" and r.json()["output"] == short


async def test_an_altered_or_foreign_item_is_refused_and_never_expanded(
    redis_url: str, tenant: str, model: str, fake: FakeProvider, recorder: Recorder
) -> None:
    """prefit's item with one character changed, or sent by another tenant, is a 400 naming
    the item, and nothing reaches the upstream; the seal verifies only for its tenant."""
    other = f"other-{uuid.uuid4().hex[:8]}"
    api_keys = f"{tenant}:{key_of(tenant)},{other}:{key_of(other)}"
    with serving(redis_url, tenant, model, fake, recorder, api_keys=api_keys, **SLOW_OK) as proxy:
        items = codex_session(60)
        await summarized(proxy, items)
        output = compact(proxy, items).json()["output"]
        at = next(i for i, item in enumerate(output) if item.get("type") == "compaction")
        sealed = output[at]["encrypted_content"]
        altered = [*output]
        altered[at] = {**output[at], "encrypted_content": sealed[:-2] + "AA"}
        before = len(proxy.fake.received)
        for body, key in ((altered, proxy.key), (output, key_of(other))):
            r = turn(proxy, body, key)
            assert r.status_code == 400 and f"input[{at}]" in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert len(proxy.fake.received) == before
        key = sealing_key(proxy.settings)
        assert unseal(key, tenant, sealed) is not None and unseal(key, other, sealed) is None


async def test_an_item_whose_record_is_gone_is_dropped_and_the_session_goes_on(
    proxy: Proxy,
) -> None:
    """A verified item whose record expired: the turn goes on with the items the client
    kept (the task among them), the header says so, the upstream never sees the item."""
    items = codex_session(60)
    conv = await summarized(proxy, items)
    output = compact(proxy, items).json()["output"]
    sealed = unseal(
        sealing_key(proxy.settings),
        proxy.tenant,
        next(i["encrypted_content"] for i in output if i.get("type") == "compaction"),
    )
    assert isinstance(sealed, Sealed) and sealed.conversation == conv
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {proxy.key}"}) as http:
        r = await http.delete(f"{proxy.url}/v1/conversations/{conv}")
    assert r.status_code in (200, 204)
    proxy.store.client.delete(keys.directory(proxy.tenant, sealed.prefix_hash))
    r = turn(proxy, [*output, {"role": "user", "content": "continue"}])
    assert r.status_code == 200 and r.headers[HEADER] == "expired"
    sent = proxy.fake.received[-1].body["input"]
    assert all(item.get("type") != "compaction" for item in sent)
    assert TASK in texts(sent) and not any(t.startswith(SUMMARY) for t in texts(sent))


@pytest.fixture
def openai_like(redis_url: str, tenant: str, model: str, recorder: Recorder) -> Iterator[Proxy]:
    """prefit in front of an upstream that knows compaction items (OpenAI)."""
    upstream = FakeProvider(limit_tokens=20_000)
    with serving(redis_url, tenant, model, upstream, recorder, **SLOW_OK) as p:
        yield p


def test_a_compaction_item_prefit_did_not_make_goes_upstream_byte_for_byte(
    openai_like: Proxy,
) -> None:
    """OpenAI's own compaction item (opaque to prefit) is carried as it came, in place."""
    theirs = {"id": "cmp_0a1b", "type": "compaction", "encrypted_content": "gAAAAABp" + "x" * 64}
    items = [*codex_session(60)[:2], theirs, {"role": "user", "content": "continue"}]
    r = turn(openai_like, items)
    assert r.status_code == 200 and HEADER not in r.headers
    sent = openai_like.fake.received[-1].body["input"]
    assert sent[2] == theirs and list(sent[2]) == list(theirs)


def test_a_sealed_reference_round_trips_only_with_its_key_and_tenant() -> None:
    """`unseal` gives back what `seal` sealed; another key, tenant or byte gives None."""
    sealed = Sealed("auto-0123", "v2:" + "ab" * 16, 12, 2)
    content = seal(b"k" * 32, "acme", sealed)
    assert content.startswith(MARK) and unseal(b"k" * 32, "acme", content) == sealed
    assert unseal(b"j" * 32, "acme", content) is None
    assert unseal(b"k" * 32, "acme2", content) is None
    assert unseal(b"k" * 32, "acme", content.replace(".", "..", 2)) is None


async def test_the_agents_sdk_compaction_session_compacts_through_prefit(proxy: Proxy) -> None:
    """`OpenAIResponsesCompactionSession` (input mode) gets prefit's compaction, stores its
    output as the session, and the next run's request carries the summary, not the item.
    The session compacts its items without the agent's instructions, so the record is found
    for an agent whose system prompt is among the items (a developer message)."""
    set_tracing_disabled(True)
    items = codex_session(60)
    conv = await summarized(proxy, items, instructions=None)
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0
    ) as client:
        store = SQLiteSession(f"s-{uuid.uuid4().hex[:8]}")
        await store.add_items(items)  # type: ignore[arg-type]
        session = OpenAIResponsesCompactionSession(
            "s", store, client=client, model=proxy.model, compaction_mode="input"
        )
        await session.run_compaction({"force": True})
        kept = await session.get_items()
        assert [i.get("type") for i in kept].count("compaction") == 1  # type: ignore[union-attr]
        model = OpenAIResponsesModel(model=proxy.model, openai_client=client)
        fixer = Agent(name="fixer", model=model)
        result = await Runner.run(fixer, "continue", session=session)
    assert result.final_output
    sent = proxy.fake.received[-1].body["input"]
    assert all(item.get("type") != "compaction" for item in sent)
    assert any(t.startswith(SUMMARY) for t in texts(sent)) and TASK in texts(sent)
    assert [r.path for r in proxy.fake.received] == ["/v1/responses", "/v1/responses"]
    assert proxy.info(conv)


def codex_compaction_turn(proxy: Proxy, items: list[dict[str, Any]]) -> httpx.Response:
    """Codex's compaction turn (compact_remote_v2.rs): its history and a trigger, streamed."""
    body = {
        "model": proxy.model,
        "instructions": INSTRUCTIONS,
        "input": [*items, {"type": "compaction_trigger"}],
        "stream": True,
        "store": False,
    }
    headers = {"Authorization": f"Bearer {proxy.key}"}
    return httpx.post(f"{proxy.url}/v1/responses", json=body, headers=headers, timeout=30)


def streamed_items(r: httpx.Response) -> list[dict[str, Any]]:
    """The items of the `response.output_item.done` events of a streamed answer."""
    out = []
    for block in r.text.split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data:
            event = json.loads(data[0])
            if event["type"] == "response.output_item.done":
                out.append(event["item"])
    assert '"type":"response.completed"' in r.text.replace(" ", "")
    return out


@pytest.mark.parametrize("ahead", [True, False])
async def test_codex_compaction_turn_is_answered_with_one_item_that_carries_the_rest(
    proxy: Proxy, ahead: bool
) -> None:
    """A `POST /v1/responses` whose input ends in `compaction_trigger` (current Codex) never
    goes upstream: its stream holds exactly one compaction item. Codex keeps the user
    messages and that item; the next turn gets, in its place, the summary (when one was made
    ahead) and every other item prefit kept, so the recent tool output is still there."""
    items = codex_session(60)
    if ahead:
        await summarized(proxy, items)
    before = len(proxy.fake.received)
    r = codex_compaction_turn(proxy, items)
    assert r.status_code == 200 and r.headers[HEADER] == ("summary" if ahead else "cheap")
    output = streamed_items(r)
    assert [i["type"] for i in output] == ["compaction"]
    assert len(proxy.fake.received) == before
    kept = [i for i in items if i.get("role") == "user"]  # what Codex retains
    history = [*kept, output[0], {"role": "user", "content": "continue"}]
    r = turn(proxy, history)
    assert r.status_code == 200 and r.headers[HEADER] == "expanded"
    sent = proxy.fake.received[-1].body["input"]
    assert {i.get("type") for i in sent}.isdisjoint({"compaction", "compaction_trigger"})
    assert TASK in texts(sent) and sent[-1] == history[-1]
    assert any(t.startswith(SUMMARY) for t in texts(sent)) == ahead
    last_output = next(i for i in reversed(items) if "output" in i)
    assert any(i.get("call_id") == last_output["call_id"] for i in sent)
