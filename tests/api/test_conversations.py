"""Stored conversations over HTTP: append, replace, get, delete, and their token bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.deps import counter_id
from shared.counting.counters import HeuristicCounter
from shared.hashing import prefix_hash
from shared.policy import ContextPolicy
from shared.service.jobs import PRIORITY_AHEAD
from shared.store import Store, keys
from shared.store.tally import Tally
from shared.summaries.book import SummaryBook, SummaryRecord
from tests.api.conftest import RESERVE, WINDOW, Recorder
from tests.api.helpers import body, conv_id
from tests.builders import assistant, call, chat, result, user
from tests.conftest import load_transcript, needs_transcripts, transcript_files


def append(
    client: TestClient, cid: str, messages: list[dict[str, Any]], model: str, **extra: Any
) -> Any:
    return client.post(f"/v1/conversations/{cid}/messages", json=body(messages, model, **extra))


def policy() -> ContextPolicy:
    return ContextPolicy(WINDOW, reserve_output=RESERVE, counter=HeuristicCounter())


def test_append_creates_and_answers_state(client: TestClient, model: str) -> None:
    """The first append creates the conversation and answers length, tokens and state."""
    cid = conv_id()
    msgs = chat(2)
    r = append(client, cid, msgs, model, expected_length=0)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["conversation_id"] == cid and data["length"] == len(msgs)
    assert data["tokens"] == HeuristicCounter().count(msgs) == data["effective_tokens"]
    assert data["state"] == "under"


def test_length_mismatch_is_409_and_changes_nothing(client: TestClient, model: str) -> None:
    """An append stating the wrong expected length gets 409 with both lengths."""
    cid = conv_id()
    append(client, cid, chat(1), model)
    r = append(client, cid, [user("more")], model, expected_length=7)
    assert r.status_code == 409
    assert r.json()["error"] == {
        "type": "LengthMismatch",
        "message": "expected length 7, stored length is 3",
        "expected": 7,
        "actual": 3,
    }
    assert client.get(f"/v1/conversations/{cid}").json()["length"] == 3


def test_tool_result_pairs_with_the_stored_call(client: TestClient, model: str) -> None:
    """A tool result may answer the tool call stored by the previous append."""
    cid = conv_id()
    assert append(client, cid, [user("list files"), call("c1")], model).status_code == 200
    r = append(
        client, cid, [result("c1", "a.txt"), assistant("one file")], model, expected_length=2
    )
    assert r.status_code == 200, r.text
    assert r.json()["length"] == 4


def test_unpaired_tool_result_is_422_with_index_and_nothing_stored(
    client: TestClient, model: str
) -> None:
    """A tool result answering no stored call names its index; the conversation is unchanged."""
    cid = conv_id()
    append(client, cid, [user("list files"), call("c1")], model)
    r = append(client, cid, [result("c1", "ok"), user("and"), result("zz", "?")], model)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "InvalidTranscript" and err["index"] == 2
    assert "tool result does not follow" in err["reason"]
    assert client.get(f"/v1/conversations/{cid}").json()["length"] == 2


@pytest.mark.parametrize(
    ("stored", "new", "index", "reason"),
    [
        ([user("go"), call("c1")], [user("and?")], 0, "'c1' were never answered"),
        ([user("go"), call("c1")], [result("c1", "a"), result("c1", "b")], 1, "already answered"),
        ([user("go")], [call("c1"), call("c2")], 1, "never answered"),
    ],
)
def test_shapes_a_provider_rejects_are_422_and_change_nothing(
    client: TestClient,
    model: str,
    stored: list[dict[str, Any]],
    new: list[dict[str, Any]],
    index: int,
    reason: str,
) -> None:
    """An unanswered call followed by more, two results for one call: refused, nothing stored."""
    cid = conv_id()
    assert append(client, cid, stored, model).status_code == 200
    before = client.get(f"/v1/conversations/{cid}").json()
    r = append(client, cid, new, model)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["index"] == index and reason in r.json()["error"]["reason"]
    assert client.get(f"/v1/conversations/{cid}").json() == before
    r = client.put(f"/v1/conversations/{cid}", json=body([*stored, *new], model))
    assert r.status_code == 422 and client.get(f"/v1/conversations/{cid}").json() == before
    r = client.post("/v1/prepare", json=body([*stored, *new], model))
    assert r.status_code == 422 and r.json()["error"]["index"] == len(stored) + index


def test_an_empty_transcript_is_422(client: TestClient, model: str) -> None:
    """Nothing to send is refused by PUT and stateless prepare, and nothing is created."""
    cid = conv_id()
    r = client.put(f"/v1/conversations/{cid}", json=body([], model))
    assert r.status_code == 422 and "empty" in r.json()["error"]["message"]
    assert client.get(f"/v1/conversations/{cid}").status_code == 404
    assert client.post("/v1/prepare", json=body([], model)).status_code == 422


def test_invalid_first_append_creates_nothing(client: TestClient, model: str) -> None:
    """A malformed message is refused with its index, and no conversation is created."""
    cid = conv_id()
    r = append(client, cid, [user("hi"), {"role": "wizard", "content": "x"}], model)
    assert r.status_code == 422
    assert r.json()["error"]["index"] == 1
    assert "unknown role 'wizard'" in r.json()["error"]["message"]
    assert client.get(f"/v1/conversations/{cid}").status_code == 404


def test_system_only_when_creating(client: TestClient, model: str) -> None:
    """An Anthropic `system` is accepted on the first append only."""
    cid = conv_id()
    first = {"format": "anthropic", "system": "Be brief."}
    assert (
        append(client, cid, [{"role": "user", "content": "hi"}], model, **first).status_code == 200
    )
    r = append(client, cid, [{"role": "assistant", "content": "yo"}], model, **first)
    assert r.status_code == 422 and "'system' can only be given" in r.json()["error"]["message"]


def test_unknown_model_needs_a_window(client: TestClient) -> None:
    """A model missing from PREFIT_MODELS is 422 unless the request gives its window."""
    cid = conv_id()
    r = append(client, cid, [user("hi")], "no-such-model")
    assert r.status_code == 422 and r.json()["error"]["type"] == "UnknownModel"
    assert "PREFIT_MODELS" in r.json()["error"]["message"]
    ok = append(client, cid, [user("hi")], "no-such-model", max_input_tokens=50_000)
    assert ok.status_code == 200 and ok.json()["state"] == "under"


def test_invalid_conversation_id_is_422(client: TestClient, model: str) -> None:
    """Ids that could break key formats (':', braces) are refused."""
    assert append(client, "a:b", [user("x")], model).status_code == 422
    assert append(client, "{x}", [user("x")], model).status_code == 422


def test_get_lists_summaries_without_text(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """GET gives length, tokens, model and each record's upto, hash, tokens, age, summarizer."""
    cid = conv_id()
    msgs = chat(6)
    append(client, cid, msgs, model)
    record = SummaryRecord(7, prefix_hash(msgs[:7]), "SECRET SUMMARY", "extractive", 12, 1.0)
    store.records.put(tenant, cid, record)
    data = client.get(f"/v1/conversations/{cid}").json()
    assert data["length"] == 13 and data["model"] == model
    assert data["tokens"] == HeuristicCounter().count(msgs)
    [summary] = data["summaries"]
    assert summary["upto"] == 7 and summary["prefix_hash"] == record.prefix_hash
    assert summary["tokens"] == 12 and summary["summarizer"] == "extractive"
    assert summary["age_s"] > 0
    assert "SECRET" not in str(data)
    expected = policy().effective_tokens(msgs, book=SummaryBook([record]))
    assert data["effective_tokens"] == expected < data["tokens"]


def test_replace_edits_and_drops_summaries_of_replaced_text(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """PUT replaces the transcript; records whose prefix changed go with it."""
    cid = conv_id()
    msgs = chat(6)
    append(client, cid, msgs, model)
    store.records.put(tenant, cid, SummaryRecord(7, prefix_hash(msgs[:7]), "s"))
    edited = [*msgs[:3], user("edited question"), *msgs[4:8]]
    r = client.put(f"/v1/conversations/{cid}", json=body(edited, model))
    assert r.status_code == 200 and r.json()["length"] == 8
    assert r.json()["tokens"] == HeuristicCounter().count(edited)
    assert client.get(f"/v1/conversations/{cid}").json()["summaries"] == []
    more = append(client, cid, [user("next")], model, expected_length=8)
    assert more.json()["tokens"] == HeuristicCounter().count([*edited, user("next")])


def test_replace_with_wrong_expected_length_is_409(client: TestClient, model: str) -> None:
    """PUT honours expected_length too."""
    cid = conv_id()
    append(client, cid, chat(1), model)
    r = client.put(f"/v1/conversations/{cid}", json=body(chat(2), model, expected_length=1))
    assert r.status_code == 409 and r.json()["error"]["actual"] == 3


def test_delete_erases_conversation_and_summaries(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """DELETE answers 204, and the conversation, its records and its tally are gone."""
    cid = conv_id()
    msgs = chat(4)
    append(client, cid, msgs, model)
    store.records.put(tenant, cid, SummaryRecord(5, prefix_hash(msgs[:5]), "s"))
    assert client.delete(f"/v1/conversations/{cid}").status_code == 204
    assert client.get(f"/v1/conversations/{cid}").status_code == 404
    assert store.records.get(tenant, prefix_hash(msgs[:5])) is None
    assert not store.client.exists(keys.conv_tally(tenant, cid), keys.conv_tally_info(tenant, cid))
    assert client.delete(f"/v1/conversations/{cid}").status_code == 204


def test_append_reads_and_counts_only_the_tip(
    client: TestClient, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a long conversation an append reads a few recent messages and counts only new ones."""
    cid = conv_id()
    append(client, cid, chat(150, size=50), model)
    reads: list[tuple[int, int]] = []
    original = Tally.read

    def spy(self: Tally, tenant: str, conv: str, *, start: int, stop: int) -> Any:
        reads.append((start, stop))
        return original(self, tenant, conv, start=start, stop=stop)

    counted: list[Any] = []
    original_count = HeuristicCounter.count_message

    def count_spy(self: HeuristicCounter, message: Any, model: str | None = None) -> int:
        counted.append(message)
        return original_count(self, message, model)

    monkeypatch.setattr(Tally, "read", spy)
    monkeypatch.setattr(HeuristicCounter, "count_message", count_spy)
    r = append(client, cid, [user("one more")], model, expected_length=301)
    assert r.status_code == 200 and r.json()["length"] == 302
    assert reads == []  # the tip read (last 32 messages) held three turn groups
    assert counted == [user("one more")]


def test_tally_is_rebuilt_when_lost(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """With the running tally gone (a crash between writes), the next append recounts once."""
    cid = conv_id()
    msgs = chat(20)
    append(client, cid, msgs, model)
    store.client.delete(keys.conv_tally(tenant, cid))
    r = append(client, cid, [user("again")], model)
    assert r.json()["tokens"] == HeuristicCounter().count([*msgs, user("again")])
    counter = counter_id(HeuristicCounter())
    tip = Tally(store.client, retention_s=60).tip(tenant, cid, counter=counter, tail=1)
    assert tip.total == HeuristicCounter().count([*msgs, user("again")])


def test_one_enqueue_per_state(
    client: TestClient, store: Store, tenant: str, model: str, recorder: Recorder
) -> None:
    """Nearing enqueues one job per state (record in use, size in 5%-of-budget steps)."""
    cid = conv_id()
    assert append(client, cid, chat(6, size=4000), model).json()["state"] == "under"
    assert recorder.jobs == []
    first = append(client, cid, [user("u" * 2000)], model).json()
    assert first["state"] == "nearing"
    for text in ("ok", "fine"):  # a few tokens more: the same state
        append(client, cid, [user(text)], model)
    [(job, priority)] = recorder.jobs
    assert priority == PRIORITY_AHEAD
    assert (job.tenant, job.conversation_id, job.model) == (tenant, cid, model)
    assert (job.max_input_tokens, job.reserve_output, job.length) == (WINDOW, RESERVE, 14)
    assert job.prefix_hash == store.conversations.hashes(tenant, cid)[14]
    grown = append(client, cid, [user("g" * 3400)], model).json()  # a 5% step further
    assert grown["effective_tokens"] // 950 > first["effective_tokens"] // 950
    assert len(recorder.jobs) == 2 and recorder.jobs[1][0].length == 17


def test_new_record_is_a_new_state(
    client: TestClient, store: Store, tenant: str, model: str, recorder: Recorder
) -> None:
    """Once a summary record lands, the next nearing append enqueues again."""
    cid = conv_id()
    msgs = chat(7, size=4000)
    append(client, cid, msgs, model)
    assert len(recorder.jobs) == 1
    store.records.put(tenant, cid, SummaryRecord(3, prefix_hash(msgs[:3]), "short"))
    r = append(client, cid, [user("x" * 100)], model)
    assert r.json()["state"] != "under"
    assert len(recorder.jobs) == 2


def test_broker_down_keeps_the_append_and_retries_later(
    client: TestClient, model: str, recorder: Recorder
) -> None:
    """A failed enqueue does not fail the append, and the next append asks again."""
    cid = conv_id()
    recorder.fail = True
    r = append(client, cid, chat(7, size=4000), model)
    assert r.status_code == 200 and r.json()["state"] != "under" and recorder.jobs == []
    recorder.fail = False
    append(client, cid, [user("again")], model)
    assert len(recorder.jobs) == 1


REAL = [
    "tau2_airline_claude-sonnet-4-5__task007.json",
    "taubench__airline_gpt-4o__task002_trial2.json",
    "mswea_gemini3pro__django__django-13315.json",
    "toolbench__G1_answer__10_ChatGPT_DFS_woFilter_w2.json",
    "tau2_airline_claude-sonnet-4-5__task007.json",  # the agent greets first
]


@needs_transcripts
@pytest.mark.parametrize("name", REAL)
def test_real_transcript_turn_by_turn_matches_the_policy(
    client: TestClient, store: Store, tenant: str, model: str, name: str
) -> None:
    """Appending a real transcript one message at a time keeps tokens and effective tokens exact."""
    [path] = [p for p in transcript_files() if p.name == name]
    msgs = load_transcript(path)["messages"]
    cid = conv_id()
    window = {"max_input_tokens": 1_000_000}
    for i, m in enumerate(msgs):
        r = append(client, cid, [m], model, expected_length=i, **window)
        assert r.status_code == 200, (i, r.text)
    assert r.json()["tokens"] == HeuristicCounter().count(msgs)
    cut = len(msgs) // 2
    while msgs[cut]["role"] == "tool":
        cut += 1
    record = SummaryRecord(cut, prefix_hash(msgs[:cut]), "a summary " * 30)
    store.records.put(tenant, cid, record)
    calls = msgs[-1].get("tool_calls") or []  # a trailing call in flight is answered first
    extra = [{"role": "tool", "tool_call_id": c["id"], "content": "done"} for c in calls]
    extra.append(user("thanks"))
    r = append(client, cid, extra, model, **window)
    p = ContextPolicy(1_000_000, counter=HeuristicCounter())
    expected = p.effective_tokens([*msgs, *extra], book=SummaryBook([record]))
    assert r.json()["effective_tokens"] == expected
