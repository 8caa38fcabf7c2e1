"""Refused writes change nothing: every 4xx of every write route leaves the tenant's keys as
they were (values and TTLs), and a request that passes every check is stored whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from shared.settings import Settings
from shared.store import Store, keys
from tests.api.conftest import Recorder, key_of
from tests.api.helpers import body
from tests.builders import assistant, call, chat, result, user

CID = "c-refusals"
Request = Callable[[TestClient, str], Any]


def dump(client: redis.Redis, tenant: str) -> dict[str, tuple[str, Any, int]]:
    """Every key of the tenant: its type, its value as Redis returns it, and its PTTL."""
    out: dict[str, tuple[str, Any, int]] = {}
    for raw in client.scan_iter(match=keys.tenant_pattern(tenant), count=1000):
        key = raw.decode()
        kind = client.type(key).decode()
        value = read_value(client, key, kind)
        out[key] = (kind, value, int(client.pttl(key)))
    return out


def read_value(client: redis.Redis, key: str, kind: str) -> Any:
    if kind == "string":
        return client.get(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "hash":
        return client.hgetall(key)
    if kind == "set":
        return client.smembers(key)
    return client.zrange(key, 0, -1, withscores=True)


SHORT_TTL_MS = 1_000_000  # far below any retention: a refresh would jump back above it


def shortened(client: redis.Redis, tenant: str) -> dict[str, tuple[str, Any, int]]:
    """Set every expiring key of the tenant to SHORT_TTL_MS, then `dump`."""
    for raw in client.scan_iter(match=keys.tenant_pattern(tenant), count=1000):
        if client.pttl(raw) > 0:
            client.pexpire(raw, SHORT_TTL_MS)
    return dump(client, tenant)


def same_store(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Keys that differ: added, removed, changed, or a TTL refreshed (Redis reports TTLs from
    a clock cached per event-loop turn, so they may wobble by milliseconds, not by minutes)."""
    bad = [k for k in before.keys() ^ after.keys()]
    for key in before.keys() & after.keys():
        (kind0, value0, ttl0), (kind1, value1, ttl1) = before[key], after[key]
        refreshed = ttl0 >= 0 and ttl1 > ttl0 + 60_000
        if kind0 != kind1 or value0 != value1 or refreshed or (ttl0 < 0) != (ttl1 < 0):
            bad.append(key)
    return sorted(bad)


def anthropic(messages: list[dict[str, Any]], model: str, **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "model": model, "format": "anthropic", **extra}


def conv(path: str = "") -> str:
    return f"/v1/conversations/{CID}{path}"


def refusals(model: str) -> dict[str, tuple[Request, int]]:
    """Named bad requests of every write route, with the status each must get."""
    post, put = "post", "put"

    def send(method: str, path: str, payload: Any = None, **kw: Any) -> Request:
        def go(c: TestClient, key: str) -> Any:
            headers = {"Authorization": f"Bearer {key}", **kw.pop("headers", {})}
            if isinstance(payload, bytes):
                headers["Content-Type"] = "application/json"
                return c.request(method, path, content=payload, headers=headers)
            return c.request(method, path, json=payload, headers=headers, **kw)

        return go

    bad_tools = [{"name": "t", "input_schema": "not an object"}]
    msgs = [user("more")]
    cases: dict[str, tuple[Request, int]] = {
        "append: body not JSON": (send(post, conv("/messages"), b"{nope"), 400),
        "append: no model": (send(post, conv("/messages"), {"messages": msgs}), 422),
        "append: unknown field": (send(post, conv("/messages"), body(msgs, model, x=1)), 422),
        "append: wrong expected_length": (
            send(post, conv("/messages"), body(msgs, model, expected_length=99)),
            409,
        ),
        "append: malformed message": (
            send(post, conv("/messages"), body([{"role": "wizard", "content": "x"}], model)),
            422,
        ),
        "append: unpaired tool result": (
            send(post, conv("/messages"), body([user("a"), result("zz", "?")], model)),
            422,
        ),
        "append: result of no stored call": (
            send(post, conv("/messages"), body([result("nope", "?")], model)),
            422,
        ),
        "append: system without anthropic": (
            send(post, conv("/messages"), body(msgs, model, system="s")),
            422,
        ),
        "append: system on an existing conversation": (
            send(post, conv("/messages"), anthropic([user("x")], model, system="s")),
            422,
        ),
        "append: anthropic tools malformed": (
            send(post, conv("/messages"), anthropic([user("x")], model, tools=bad_tools)),
            422,
        ),
        "append: unknown model": (send(post, conv("/messages"), body(msgs, "no-such")), 422),
        "append: window below reserve": (
            send(post, conv("/messages"), body(msgs, model, max_input_tokens=10)),
            422,
        ),
        "append: whitespace model, window below reserve": (
            send(post, conv("/messages"), body(msgs, "gpt 4o", max_input_tokens=10)),
            422,
        ),
        "append: too many messages": (
            send(post, conv("/messages"), body([user("x")] * 6, model)),
            422,
        ),
        "append: string too long": (
            send(post, conv("/messages"), body([user("x" * 5000)], model)),
            422,
        ),
        "append: bad conversation id": (
            send(post, "/v1/conversations/a:b/messages", body(msgs, model)),
            422,
        ),
        "append: body over the byte limit": (
            send(post, conv("/messages"), body([user("y" * 3000)] * 5, model)),
            413,
        ),
        "append: wrong key": (
            lambda c, key: c.post(
                conv("/messages"), json=body(msgs, model), headers={"Authorization": "Bearer x"}
            ),
            401,
        ),
        "put: malformed transcript": (
            send(put, conv(), body([user("a"), result("zz", "?")], model)),
            422,
        ),
        "put: wrong expected_length": (
            send(put, conv(), body(chat(1), model, expected_length=1)),
            409,
        ),
        "put: anthropic tools malformed": (
            send(put, conv(), anthropic([user("x")], model, tools=bad_tools)),
            422,
        ),
        "put: unknown model": (send(put, conv(), body(chat(1), "no-such")), 422),
        "put: whitespace model, window below reserve": (
            send(put, conv(), body(chat(1), "gpt 4o", max_input_tokens=10)),
            422,
        ),
        "delete: bad conversation id": (send("delete", "/v1/conversations/{x}"), 422),
        "delete: wrong key": (
            lambda c, key: c.delete(conv(), headers={"Authorization": "Bearer x"}),
            401,
        ),
        "observe: malformed message": (
            send(
                post,
                "/v1/observe",
                {"model": model, "messages": [{"role": 1}], "actual_prompt_tokens": 5},
            ),
            422,
        ),
        "observe: no count": (send(post, "/v1/observe", body(msgs, model)), 422),
        "observe: zero count": (
            send(post, "/v1/observe", {**body(msgs, model), "actual_prompt_tokens": 0}),
            422,
        ),
        "prepare: bad tools": (
            send(
                post,
                conv("/prepare"),
                {"model": model, "format": "anthropic", "tools": bad_tools},
            ),
            422,
        ),
        "prepare: missing conversation": (
            send(post, "/v1/conversations/c-missing/prepare", {"model": model}),
            404,
        ),
        "prepare: pressure out of range": (
            send(post, conv("/prepare"), {"model": model, "pressure": 2}),
            422,
        ),
        "prepare: unknown model": (send(post, conv("/prepare"), {"model": "no-such"}), 422),
        "stateless prepare: malformed": (
            send(post, "/v1/prepare", body([result("zz", "?")], model)),
            422,
        ),
    }
    return cases


@pytest.fixture
def small(settings: Settings) -> Settings:
    """The test's settings with small limits, so size refusals are cheap to provoke."""
    return settings.model_copy(
        update={"max_messages": 5, "max_string_chars": 4000, "max_body_bytes": 12_000}
    )


CASES = sorted(refusals("m"))


@pytest.mark.parametrize("case", CASES)
def test_every_refused_write_leaves_the_store_untouched(
    case: str, small: Settings, store: Store, tenant: str, model: str
) -> None:
    """Each 4xx of append, PUT, DELETE, observe and prepare changes no key, value or TTL."""
    request, status = refusals(model)[case]
    with TestClient(
        create_app(small, store=store, enqueue=Recorder()), raise_server_exceptions=False
    ) as c:
        auth = {"Authorization": f"Bearer {key_of(tenant)}"}
        start = [*chat(1), call("c1")]
        created = c.put(conv(), json=body(start, model), headers=auth)
        assert created.status_code == 200, created.text
        before = shortened(store.client, tenant)
        r = request(c, key_of(tenant))
        assert r.status_code == status, (case, r.status_code, r.text)
        assert r.json()["error"]["type"], r.text
        after = dump(store.client, tenant)
        assert same_store(before, after) == [], case
        answer = body([result("c1", "ok"), assistant("done")], model)
        follow = c.post(conv("/messages"), json=answer, headers=auth)
        assert follow.status_code == 200, follow.text


@pytest.mark.parametrize("method", ["post", "put"])
def test_a_model_name_of_any_characters_is_stored_and_read_back(
    method: str, client: TestClient
) -> None:
    """A model name with whitespace, ':' or braces is accepted with a window, and reads back."""
    name = "gpt 4o:x*{z}"
    path = conv("/messages") if method == "post" else conv()
    r = client.request(method, path, json=body(chat(1), name, max_input_tokens=50_000))
    assert r.status_code == 200, r.text
    got = client.get(conv())
    assert got.status_code == 200 and got.json()["model"] == name
    prepared = client.post(conv("/prepare"), json={"model": name, "max_input_tokens": 50_000})
    assert prepared.status_code == 200 and len(prepared.json()["messages"]) == 3
