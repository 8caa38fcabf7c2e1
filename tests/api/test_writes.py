"""Concurrent appends all land, atomically; PUT of a grown transcript writes only what is new."""

from __future__ import annotations

import threading
from itertools import accumulate
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.conversations import Conversations
from api.deps import Services, counter_id
from api.policies import resolve_window
from shared.counting.counters import HeuristicCounter
from shared.hashing import prefix_hash, prefix_hashes
from shared.messages import validate
from shared.store import Store, keys
from shared.summaries.book import SummaryRecord
from tests.api.conftest import key_of
from tests.api.helpers import body, conv_id
from tests.api.server import serve
from tests.builders import assistant, call, chat, result, user
from tests.shared.store.helpers import run_threads

THREADS, APPENDS = 20, 10


def stored(store: Store, tenant: str, cid: str) -> list[dict[str, Any]]:
    return store.conversations.read(tenant, cid)


def assert_consistent(store: Store, tenant: str, cid: str) -> list[dict[str, Any]]:
    """The chain and the running tally equal a recount of the stored messages."""
    msgs = stored(store, tenant, cid)
    validate(msgs)
    assert store.conversations.hashes(tenant, cid) == prefix_hashes(msgs)
    counter = HeuristicCounter()
    tally = [int(x) for x in store.client.lrange(keys.conv_tally(tenant, cid), 0, -1)]
    assert tally == list(accumulate(counter.count_message(m) for m in msgs))
    info = store.client.hgetall(keys.conv_tally_info(tenant, cid))
    assert info[b"hash"].decode() == prefix_hash(msgs)
    assert info[b"counter"].decode() == counter_id(counter)
    return msgs


def run_writers(url: str, tenant: str, work: Any) -> list[int]:
    """Run `work(client, i)` on THREADS threads at once; every status they saw."""

    def one(i: int) -> list[int]:
        headers = {"Authorization": f"Bearer {key_of(tenant)}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
            found: list[int] = work(c, i)
            return found

    results: list[Any] = run_threads(one, THREADS)
    return [status for statuses in results for status in statuses]


def test_concurrent_appends_without_expected_length_all_land(
    app: FastAPI, store: Store, tenant: str, model: str
) -> None:
    """20 threads x 10 appends to one conversation: 200 x 200, each thread's order kept,
    chain and tally equal to a recount."""
    cid = conv_id()

    def work(c: httpx.Client, i: int) -> list[int]:
        path = f"/v1/conversations/{cid}/messages"
        return [
            c.post(path, json=body([user(f"w{i}-{j}")], model)).status_code for j in range(APPENDS)
        ]

    with serve(app) as url:
        first = httpx.put(
            f"{url}/v1/conversations/{cid}",
            json=body(chat(1), model),
            headers={"Authorization": f"Bearer {key_of(tenant)}"},
        )
        assert first.status_code == 200, first.text
        statuses = run_writers(url, tenant, work)
    assert statuses == [200] * (THREADS * APPENDS)
    msgs = assert_consistent(store, tenant, cid)
    texts = [m["content"] for m in msgs[3:]]
    assert sorted(texts) == sorted(f"w{i}-{j}" for i in range(THREADS) for j in range(APPENDS))
    for i in range(THREADS):
        mine = [t for t in texts if t.startswith(f"w{i}-")]
        assert mine == [f"w{i}-{j}" for j in range(APPENDS)]


def test_concurrent_tool_turns_answer_200_or_a_precise_422(
    app: FastAPI, store: Store, tenant: str, model: str
) -> None:
    """Writers that each append a tool call then its result race on one conversation: every
    answer is 200 or 422 InvalidTranscript (a call while another writer's call is unanswered,
    or a result whose call another writer's turn followed), never 503 or 409, and the stored
    transcript stays valid and consistent."""
    cid = conv_id()
    errors: list[str] = []
    landed = {"calls": 0, "results": 0}
    lock = threading.Lock()

    def work(c: httpx.Client, i: int) -> list[int]:
        path = f"/v1/conversations/{cid}/messages"
        out = []
        for j in range(3):
            r = c.post(path, json=body([call(f"c{i}-{j}")], model))
            out.append(r.status_code)
            kind = "calls"
            if r.is_success:
                r = c.post(path, json=body([result(f"c{i}-{j}", "ok"), assistant("done")], model))
                out.append(r.status_code)
                kind = "results"
            if r.status_code == 422:
                errors.append(r.json()["error"]["type"])
            with lock:
                landed["calls"] += kind == "results"
                landed["results"] += kind == "results" and r.is_success
        return out

    with serve(app) as url:
        headers = {"Authorization": f"Bearer {key_of(tenant)}"}
        assert httpx.put(
            f"{url}/v1/conversations/{cid}", json=body(chat(1), model), headers=headers
        ).is_success
        statuses = run_writers(url, tenant, work)
    assert set(statuses) <= {200, 422} and landed["results"] > 0
    assert set(errors) <= {"InvalidTranscript"}
    msgs = assert_consistent(store, tenant, cid)
    assert len(msgs) == 3 + landed["calls"] + 2 * landed["results"]


def test_a_result_validated_against_a_moved_tip_is_checked_again(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """An append whose tip moved between its read and its write is validated again: a tool
    result that now follows another turn is refused precisely, and nothing is written."""
    cid = conv_id()
    start = body([*chat(1), call("c1")], model)
    assert client.put(f"/v1/conversations/{cid}", json=start).is_success
    writes = store.conversations.writes
    original = writes.append
    moved = {"done": False}

    def interleave(tenant_: str, conv: str, plan: Any) -> Any:
        if not moved["done"]:  # another writer's turn lands first
            moved["done"] = True
            store.conversations.append(tenant_, conv, [user("someone else")])
        return original(tenant_, conv, plan)

    writes.append = interleave  # type: ignore[method-assign]
    try:
        r = client.post(f"/v1/conversations/{cid}/messages", json=body([result("c1", "ok")], model))
    finally:
        del writes.append
    assert r.status_code == 422, r.text
    assert "tool result does not follow" in r.json()["error"]["message"]
    assert [m["content"] for m in stored(store, tenant, cid)[-2:]] == [None, "someone else"]


def test_put_of_a_grown_transcript_appends_only_the_new_messages(
    client: TestClient, app: FastAPI, store: Store, tenant: str, model: str
) -> None:
    """A PUT whose transcript starts with the stored one writes and counts only the rest; the
    records and the process cache are kept."""
    cid = conv_id()
    msgs = chat(100, size=200)
    assert client.put(f"/v1/conversations/{cid}", json=body(msgs, model)).is_success
    record = SummaryRecord(7, prefix_hash(msgs[:7]), "s")
    store.records.put(tenant, cid, record)
    client.post(f"/v1/conversations/{cid}/prepare", json={"model": model})  # caches it
    svc: Services = app.state.services
    cached = svc.cache._get(tenant, cid)
    sent: list[int] = []
    raw: Any = store.client
    original = raw.execute_command

    def spy(*args: Any, **kwargs: Any) -> Any:
        sent.append(sum(len(a) for a in args if isinstance(a, bytes | str)))
        return original(*args, **kwargs)

    grown = [*msgs, user("next " + "x" * 300), assistant("ok")]
    raw.execute_command = spy
    try:
        r = client.put(f"/v1/conversations/{cid}", json=body(grown, model))
    finally:
        del raw.execute_command
    assert r.status_code == 200 and r.json()["length"] == len(grown)
    assert r.json()["tokens"] == HeuristicCounter().count(grown)
    assert max(sent) < 5000  # the new messages' worth, not 40 kB of transcript
    assert_consistent(store, tenant, cid)
    assert store.records.list(tenant, cid) == [record]
    after = svc.cache._get(tenant, cid)
    assert cached is not None and after is not None and after.messages[0] is cached.messages[0]


def test_put_of_an_edited_transcript_replaces_it(
    client: TestClient, store: Store, tenant: str, model: str
) -> None:
    """A PUT that changes an earlier message replaces everything; records of the old text go."""
    cid = conv_id()
    msgs = chat(10)
    client.put(f"/v1/conversations/{cid}", json=body(msgs, model))
    store.records.put(tenant, cid, SummaryRecord(7, prefix_hash(msgs[:7]), "s"))
    edited = [*msgs[:3], user("edited"), *msgs[4:], user("and more")]
    r = client.put(f"/v1/conversations/{cid}", json=body(edited, model))
    assert r.status_code == 200 and r.json()["tokens"] == HeuristicCounter().count(edited)
    assert stored(store, tenant, cid) == edited
    assert store.records.list(tenant, cid) == []
    assert_consistent(store, tenant, cid)


@pytest.mark.parametrize("grow", [True, False])
def test_sync_is_one_call_for_a_proxy(
    app: FastAPI, store: Store, tenant: str, model: str, grow: bool
) -> None:
    """`Conversations.sync` stores a whole transcript (appending or replacing) and sizes it."""
    svc: Services = app.state.services
    cid = conv_id()
    window = resolve_window(svc.settings, model, None)
    first = chat(3)
    Conversations(svc).sync(tenant, cid, first, window)
    second = [*first, user("more")] if grow else [user("other"), assistant("x")]
    sizes = Conversations(svc).sync(tenant, cid, second, window, [{"type": "function"}])
    assert sizes.length == len(second) and sizes.state == "under"
    counter = HeuristicCounter()
    assert sizes.tokens == counter.count(second, [{"type": "function"}])
    assert stored(store, tenant, cid) == second
    assert_consistent(store, tenant, cid)
