"""Prepare (stored and stateless) and observe over HTTP: reports, summaries, staleness, formats."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi.testclient import TestClient

from api.policies import resolve_window
from shared.counting.counters import HeuristicCounter
from shared.formats import from_anthropic
from shared.hashing import prefix_hash
from shared.messages import validate
from shared.service.jobs import PRIORITY_STALE, SummaryJob
from shared.service.windows import service_policy
from shared.settings import Settings
from shared.store import Store
from shared.strategies import Summarize
from shared.summaries.book import SummaryRecord
from shared.summaries.incremental import summary_message
from tests.api.conftest import Recorder
from tests.api.helpers import body, conv_id
from tests.builders import call, chat, result, user
from tests.shared import preambles

REPORT_KEYS = {
    "tokens_before", "tokens_after", "budget", "applied", "summary", "dropped_groups", "stale",
    "degraded",
}  # fmt: skip


def store_chat(client: TestClient, model: str, messages: list[dict[str, Any]]) -> str:
    cid = conv_id()
    r = client.post(f"/v1/conversations/{cid}/messages", json=body(messages, model))
    assert r.status_code == 200, r.text
    return cid


def test_stateless_prepare_under_the_trigger_is_unchanged(client: TestClient, model: str) -> None:
    """A small transcript comes back as it was, with a full report."""
    msgs = chat(3)
    r = client.post("/v1/prepare", json=body(msgs, model))
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["messages"] == msgs
    assert data["tokens"] == HeuristicCounter().count(msgs)
    assert set(data["report"]) >= REPORT_KEYS
    assert data["report"]["applied"] == [] and data["report"]["degraded"] is False


def test_stateless_prepare_over_the_trigger_cuts_cheaply(client: TestClient, model: str) -> None:
    """Over the trigger with no summary anywhere, DropOldest brings it under budget."""
    msgs = chat(12, size=4000)
    data = client.post("/v1/prepare", json=body(msgs, model)).json()
    report = data["report"]
    assert report["tokens_before"] > report["budget"] >= report["tokens_after"] == data["tokens"]
    assert [a["strategy"] for a in report["applied"]][-1] == "DropOldest"
    assert report["dropped_groups"] > 0 and report["summary"] is None
    assert data["messages"][:2] == msgs[:2]  # the head stays


def test_stored_prepare_serves_the_summary_made_ahead(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """A stored conversation over the trigger is served from its ready summary record."""
    msgs = chat(12, size=4000)
    cid = store_chat(client, model, msgs)
    cut = 19
    record = SummaryRecord(cut, prefix_hash(msgs[:cut]), "what happened so far", "extractive")
    store.records.put(tenant, cid, record)
    r = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["report"]["summary"] == {
        "upto": cut, "prefix_hash": record.prefix_hash, "summarizer": "extractive"
    }  # fmt: skip
    assert data["report"]["stale"] is False
    assert data["messages"] == [*msgs[:2], summary_message(record, 2), *msgs[cut:]]


def test_stale_prepare_enqueues_at_high_priority(
    client: TestClient, model: str, recorder: Recorder
) -> None:
    """Without a ready summary the report says stale and a stale-priority job is sent."""
    cid = store_chat(client, model, chat(12, size=4000))
    data = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model}).json()
    assert data["report"]["stale"] is True and data["report"]["summary"] is None
    assert data["tokens"] <= data["report"]["budget"]
    stale = [(job, p) for job, p in recorder.jobs if p == PRIORITY_STALE]
    assert len(stale) == 1 and stale[0][0].conversation_id == cid and stale[0][0].length == 25
    client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
    assert len([p for _, p in recorder.jobs if p == PRIORITY_STALE]) == 1  # deduplicated


def test_stale_prepare_waits_for_the_summary(
    client: TestClient, store: Store, tenant: str, model: str, recorder: Recorder
) -> None:
    """With wait_ms, prepare waits for the worker's record and uses it."""
    msgs = chat(12, size=4000)
    cid = store_chat(client, model, msgs)
    record = SummaryRecord(19, prefix_hash(msgs[:19]), "made while you waited")

    def worker(job: SummaryJob, priority: int) -> None:
        recorder(job, priority)
        if priority == PRIORITY_STALE:
            threading.Timer(0.1, store.records.put, (tenant, cid, record)).start()

    client.app.state.services.scheduler._enqueue = worker  # type: ignore[attr-defined]
    started = time.monotonic()
    r = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model, "wait_ms": 5000})
    report = r.json()["report"]
    assert report["summary"]["upto"] == 19 and report["stale"] is False
    assert report["waited_ms"] > 0 and time.monotonic() - started < 5


def test_stored_prepare_of_missing_conversation_is_404(client: TestClient, model: str) -> None:
    """An unknown conversation is 404 with a typed error."""
    r = client.post(f"/v1/conversations/{conv_id()}/prepare", json={"model": model})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound"


def test_stored_prepare_sees_appends_made_after_it_cached(client: TestClient, model: str) -> None:
    """The process cache never serves a stale transcript: appends and replaces show at once."""
    msgs = chat(2)
    cid = store_chat(client, model, msgs)
    url = f"/v1/conversations/{cid}/prepare"
    assert client.post(url, json={"model": model}).json()["messages"] == msgs
    client.post(f"/v1/conversations/{cid}/messages", json=body([user("new")], model))
    assert client.post(url, json={"model": model}).json()["messages"] == [*msgs, user("new")]
    client.put(f"/v1/conversations/{cid}", json=body([user("only")], model))
    assert client.post(url, json={"model": model}).json()["messages"] == [user("only")]


def test_anthropic_round_trip_is_lossless(client: TestClient, model: str) -> None:
    """Anthropic messages stored and prepared come back exactly as sent."""
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "tu1", "name": "ls", "input": {"path": "."}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": "a.txt", "is_error": False},
            {"type": "text", "text": "go on"},
        ]},
    ]  # fmt: skip
    cid = conv_id()
    create = {"messages": messages[:2], "model": model, "format": "anthropic", "system": system}
    assert client.post(f"/v1/conversations/{cid}/messages", json=create).status_code == 200
    more = {"messages": messages[2:], "model": model, "format": "anthropic"}
    assert client.post(f"/v1/conversations/{cid}/messages", json=more).status_code == 200
    assert client.get(f"/v1/conversations/{cid}").json()["length"] == len(
        from_anthropic(system, messages)
    )
    r = client.post(
        f"/v1/conversations/{cid}/prepare", json={"model": model, "format": "anthropic"}
    )
    assert r.json()["system"] == system and r.json()["messages"] == messages
    stateless = {"messages": messages, "system": system, "model": model, "format": "anthropic"}
    r = client.post("/v1/prepare", json=stateless)
    assert r.json()["system"] == system and r.json()["messages"] == messages


def test_does_not_fit_is_422_with_sizes(client: TestClient, model: str) -> None:
    """When head and recent tail alone exceed the budget the error says by how much."""
    msgs = chat(3, size=8000)
    r = client.post("/v1/prepare", json=body(msgs, model, max_input_tokens=5000))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "DoesNotFit" and err["budget"] == 4000 and err["tokens"] > 4000
    assert err["head_tokens"] > 0 and err["tail_tokens"] > 0


def test_window_smaller_than_reserve_is_422(client: TestClient, model: str) -> None:
    """A window that leaves nothing after the reserved output is refused."""
    r = client.post("/v1/prepare", json=body(chat(1), model, max_input_tokens=500))
    assert r.status_code == 422 and "reserve_output" in r.json()["error"]["message"]


def test_pressure_out_of_range_is_422(client: TestClient, model: str) -> None:
    """pressure must be within (0, 1]."""
    r = client.post("/v1/prepare", json=body(chat(1), model, pressure=1.5))
    assert r.status_code == 422 and "pressure" in r.json()["error"]["message"]


def test_lower_pressure_cuts_deeper(client: TestClient, model: str) -> None:
    """pressure < 1 treats the estimate as too low, so the answer is smaller."""
    msgs = chat(12, size=4000)
    full = client.post("/v1/prepare", json=body(msgs, model)).json()
    pressed = client.post("/v1/prepare", json=body(msgs, model, pressure=0.5)).json()
    assert len(pressed["messages"]) < len(full["messages"])


def test_stateless_prepare_finds_the_tenants_summary_by_content(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """A stateless transcript starting like a stored one is served that conversation's record."""
    msgs = chat(12, size=4000)
    cid = store_chat(client, model, msgs)
    record = SummaryRecord(19, prefix_hash(msgs[:19]), "shared summary")
    store.records.put(tenant, cid, record)
    report = client.post("/v1/prepare", json=body(msgs, model)).json()["report"]
    assert report["summary"]["upto"] == 19


def test_observe_calibrates_the_tenants_ratio(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """observe feeds the tenant's Redis ratio of the model: later counts scale by it."""
    msgs = chat(2)
    estimated = HeuristicCounter().count(msgs)
    r = client.post(
        "/v1/observe", json={**body(msgs, model), "actual_prompt_tokens": 2 * estimated}
    )
    assert r.status_code == 204
    calibration = store.ratios.calibration(tenant, model)
    assert calibration is not None and calibration.ratio == 2.0
    time.sleep(1.05)  # the API caches ratios for a second
    data = client.post("/v1/prepare", json=body(msgs, model)).json()
    assert data["tokens"] == 2 * estimated


def test_observe_needs_a_positive_count(client: TestClient, model: str) -> None:
    """actual_prompt_tokens must be a positive integer."""
    r = client.post("/v1/observe", json={**body(chat(1), model), "actual_prompt_tokens": 0})
    assert r.status_code == 422 and r.json()["error"]["type"] == "InvalidRequest"


def test_tool_pairs_survive_prepare(client: TestClient, model: str) -> None:
    """Dropped turns take their tool results with them: the answer is a valid transcript."""
    msgs: list[dict[str, Any]] = [user("task")]
    for i in range(30):
        msgs += [call(f"c{i}"), result(f"c{i}", "out " * 800), user(f"next {i}")]
    data = client.post("/v1/prepare", json=body(msgs, model)).json()
    validate(data["messages"])
    assert data["report"]["changed"] is True


def test_a_record_reaching_into_the_recent_tail_is_not_used(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """Records past the protected tail (left by a shortening replace) give way to earlier ones."""
    msgs = chat(12, size=4000)
    cid = store_chat(client, model, msgs)
    early = SummaryRecord(19, prefix_hash(msgs[:19]), "early")
    store.records.put(tenant, cid, early)
    store.records.put(tenant, cid, SummaryRecord(24, prefix_hash(msgs[:24]), "too far"))
    report = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model}).json()["report"]
    assert report["summary"]["upto"] == 19


def test_the_api_policy_never_holds_a_summarizer(settings: Settings, model: str) -> None:
    """The policy prepare runs with has no summarizer anywhere: it cannot call an LLM."""
    window = resolve_window(settings, model, None)
    policy = service_policy(
        settings, window.max_input_tokens, window.reserve_output, HeuristicCounter()
    )
    assert policy.summarizer is None
    summarizers = [s for s in policy.strategies if isinstance(s, Summarize)]
    assert summarizers and all(s._own is None for s in summarizers)


def test_a_stale_wait_that_times_out_still_answers(client: TestClient, model: str) -> None:
    """No record within wait_ms: the answer comes anyway, cut cheaply, saying how long it waited."""
    cid = store_chat(client, model, chat(12, size=4000))
    r = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model, "wait_ms": 100})
    report = r.json()["report"]
    assert r.status_code == 200 and report["stale"] is True and report["waited_ms"] >= 100


def test_no_wait_and_no_job_when_only_the_recent_turns_are_left(
    client: TestClient, store: Store, tenant: str, model: str, recorder: Recorder
) -> None:
    """A record reaching the protected recent turns is the best there can be: even over the
    trigger, prepare is not stale, answers without waiting out wait_ms, and enqueues nothing."""
    msgs = chat(12, size=4000)
    msgs[-3:] = [{**m, "content": str(m["content"]) + "x" * 14_500} for m in msgs[-3:]]
    cid = store_chat(client, model, msgs)
    tail = len(msgs) - 3
    store.records.put(
        tenant, cid, SummaryRecord(tail, prefix_hash(msgs[:tail]), "all but the tail")
    )
    recorder.jobs.clear()
    r = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model, "wait_ms": 2000})
    assert r.status_code == 200, r.text
    report = r.json()["report"]
    assert report["tokens_before"] > report["trigger_tokens"]
    assert report["summary"]["upto"] == tail and report["stale"] is False
    assert "waited_ms" not in report
    assert [p for _, p in recorder.jobs if p == PRIORITY_STALE] == []


def test_stateless_prepare_refuses_a_lone_surrogate(client: TestClient, model: str) -> None:
    """A JSON `\\ud800` escape (a JS client cutting an emoji in half) is a 422, not a 500."""
    content = '"half \\ud83d an emoji"'
    raw = f'{{"model": "{model}", "messages": [{{"role": "user", "content": {content}}}]}}'
    r = client.post("/v1/prepare", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "InvalidTranscript"


def test_a_stored_prepare_keeps_the_task_behind_a_learned_preamble(
    client: TestClient, model: str
) -> None:
    """Conversations of one tenant opening with one instruction block: the first loses its
    task past the window, the second keeps it once the memory learned the block."""
    tasks = ("Fix the login bug in auth.py", "Port the CLI to click")
    kept = []
    for task in tasks:
        cid = conv_id()
        messages = preambles.prompts(task, 40)[-1]
        put = client.put(f"/v1/conversations/{cid}", json=body(messages, model))
        assert put.status_code == 200, put.text
        r = client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})
        assert r.status_code == 200, r.text
        assert r.json()["report"]["tokens_after"] < r.json()["report"]["tokens_before"]
        kept.append(task in str(r.json()["messages"]))
    assert kept == [False, True]
