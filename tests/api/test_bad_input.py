"""Malformed requests as clients send them: each gets a precise 4xx naming the fault, and the
store is left exactly as it was (keys, values and TTLs)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of
from tests.api.helpers import body
from tests.api.test_refusals import dump, same_store, shortened
from tests.builders import chat, user

CID = "c-bad-input"
CONV = f"/v1/conversations/{CID}"
JSON_CT = {"Content-Type": "application/json"}
MSGS = [user("more")]

# name: (method, path, body as JSON or raw bytes, extra headers, status, type, message part)
Case = tuple[str, str, Any, dict[str, str], int, str, str]


def nested(depth: int) -> dict[str, Any]:
    """A tool whose parameter schema nests `depth` objects."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


def cases(model: str) -> dict[str, Case]:
    """Named bad requests and the answer each must get."""
    append, prepare = f"{CONV}/messages", f"{CONV}/prepare"
    valid = json.dumps(body(MSGS, model)).encode()
    return {
        "expected_length as a string": (
            "post", append, body(MSGS, model, expected_length="3"), {}, 422,
            "InvalidRequest", "expected_length: must be a JSON number, got str",
        ),
        "max_input_tokens true": (
            "put", CONV, body(chat(1), model, max_input_tokens=True), {}, 422,
            "InvalidRequest", "max_input_tokens: must be a JSON number, got bool",
        ),
        "wait_ms as a string": (
            "post", prepare, {"model": model, "wait_ms": "100"}, {}, 422,
            "InvalidRequest", "wait_ms: must be a JSON number",
        ),
        "pressure as a string": (
            "post", prepare, {"model": model, "pressure": "0.5"}, {}, 422,
            "InvalidRequest", "pressure: must be a JSON number",
        ),
        "observe count as a string": (
            "post", "/v1/observe", {**body(MSGS, model), "actual_prompt_tokens": "50"}, {},
            422, "InvalidRequest", "actual_prompt_tokens: must be a JSON number",
        ),
        "no content-type": (
            "post", append, valid, {"Content-Type": ""}, 415,
            "InvalidRequest", "content-type: application/json, got no content-type",
        ),
        "form content-type (curl -d)": (
            "post", append, valid, {"Content-Type": "application/x-www-form-urlencoded"}, 415,
            "InvalidRequest", "got content-type 'application/x-www-form-urlencoded'",
        ),
        "body not UTF-8": (
            "put", CONV, b'{"messages": [{"role": "user", "content": "\xff"}]}', JSON_CT, 400,
            "InvalidTranscript", "request body is not valid JSON: it is not UTF-8",
        ),
        "body nested too deeply": (
            "post", append, b"[" * 100_000, JSON_CT, 400,
            "InvalidTranscript", "request body is not valid JSON: it is nested too deeply",
        ),
        "NaN in a message": (
            "post", append, b'{"model": "%s", "messages": [{"role": "user", "content": "x", '
            b'"weight": NaN}]}' % model.encode(), JSON_CT, 400,
            "InvalidTranscript", "NaN (JSON has no NaN or Infinity) at messages[0].weight",
        ),
        "Infinity in a replace": (
            "put", CONV, b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], '
            b'"max_input_tokens": -Infinity}' % model.encode(), JSON_CT, 400,
            "InvalidTranscript", "-Infinity (JSON has no NaN or Infinity) at max_input_tokens",
        ),
        "a number past a double's range": (
            "post", prepare, b'{"model": "%s", "pressure": 1e400}' % model.encode(), JSON_CT,
            400, "InvalidTranscript", "1e400 (out of a double's range) at pressure",
        ),
        "an integer of 5,000 digits": (
            "post", "/v1/prepare", b'{"model": "%s", "messages": [{"role": "user", "content": '
            b'[{"type": "text", "text": "x", "n": %s}]}]}' % (model.encode(), b"9" * 5000),
            JSON_CT, 400, "InvalidTranscript",
            "an integer of 5000 digits (at most 40) at messages[0].content[0].n",
        ),
        "pressure of the least double": (
            "post", prepare, {"model": model, "pressure": 5e-324}, {}, 422,
            "InvalidRequest", "pressure: Input should be greater than or equal to 0.001",
        ),
        "pressure of 1e-300 (stateless)": (
            "post", "/v1/prepare", body(MSGS, model, pressure=1e-300), {}, 422,
            "InvalidRequest", "pressure: Input should be greater than or equal to 0.001",
        ),
        "pressure over 1": (
            "post", "/v1/prepare", body(MSGS, model, pressure=1.5), {}, 422,
            "InvalidRequest", "pressure: Input should be less than or equal to 1",
        ),
        "body an array": (
            "put", CONV, [1, 2], {}, 422,
            "InvalidRequest", "request body must be a JSON object, got an array",
        ),
        "body a number": (
            "post", prepare, 5, {}, 422,
            "InvalidRequest", "request body must be a JSON object, got a number",
        ),
        "no body": (
            "post", prepare, None, {}, 422, "InvalidRequest", "request body is missing",
        ),
        "messages not a list": (
            "post", append, {"messages": "hi", "model": model}, {}, 422,
            "InvalidTranscript", "messages: Input should be a valid list",
        ),
        "messages missing": (
            "put", CONV, {"model": model}, {}, 422, "InvalidTranscript", "messages: Field required",
        ),
        "tools nested 300 deep (append)": (
            "post", append, body(MSGS, model, tools=[nested(300)]), {}, 422,
            "TooLarge", "nested deeper than 100 levels",
        ),
        "tools nested 300 deep (stateless prepare)": (
            "post", "/v1/prepare", body(MSGS, model, tools=[nested(300)]), {}, 422,
            "TooLarge", "tools[0].function.parameters.properties.a",
        ),
        "content nested 450 deep (observe)": (
            "post", "/v1/observe",
            {"model": model, "actual_prompt_tokens": 9,
             "messages": [{"role": "user", "content": [[[[]]]] * 2 + [nested(450)]}]},
            {}, 422, "TooLarge", "messages[0].content[2]",
        ),
        "system a number": (
            "put", CONV, {**body(chat(1), model), "format": "anthropic", "system": 5}, {}, 422,
            "InvalidTranscript", "system: must be a string or a list of content blocks",
        ),
        "conversation id with a colon": (
            "get", "/v1/conversations/a:b", None, {}, 422,
            "InvalidId", "invalid conversation id 'a:b': use 1-128 letters",
        ),
        "conversation id of 1000 characters": (
            "delete", "/v1/conversations/" + "x" * 1000, None, {}, 422,
            "InvalidId", "invalid conversation id 'xxxx",
        ),
        "conversation id of unicode": (
            "post", "/v1/conversations/caf%C3%A9/messages", body(MSGS, model), {}, 422,
            "InvalidId", "invalid conversation id 'café'",
        ),
    }  # fmt: skip


def send(c: TestClient, case: Case, key: str) -> Any:
    method, path, payload, headers, *_ = case
    auth = {"Authorization": f"Bearer {key}", **headers}
    if isinstance(payload, bytes):
        return c.request(method, path, content=payload, headers=auth)
    return c.request(method, path, json=payload, headers=auth)


@pytest.mark.parametrize("name", sorted(cases("m")))
def test_a_bad_request_gets_a_precise_4xx_and_changes_nothing(
    name: str, settings: Settings, store: Store, tenant: str, model: str
) -> None:
    """The status, error type and message name the fault; no key, value or TTL changes."""
    case = cases(model)[name]
    with TestClient(
        create_app(settings, store=store, enqueue=Recorder()), raise_server_exceptions=False
    ) as c:
        auth = {"Authorization": f"Bearer {key_of(tenant)}"}
        assert c.put(CONV, json=body(chat(1), model), headers=auth).status_code == 200
        before = shortened(store.client, tenant)
        r = send(c, case, key_of(tenant))
        status, kind, part = case[4:]
        assert (r.status_code, r.json()["error"]["type"]) == (status, kind), r.text
        assert part in r.json()["error"]["message"], r.text
        assert same_store(before, dump(store.client, tenant)) == [], name


def test_a_tool_schema_of_real_depth_is_accepted(client: TestClient, model: str) -> None:
    """Nesting well inside the limit (30 levels) is stored as usual."""
    r = client.post(f"{CONV}-deep/messages", json=body(MSGS, model, tools=[nested(30)]))
    assert r.status_code == 200, r.text


def test_an_empty_first_append_is_refused_as_empty(client: TestClient, model: str) -> None:
    """With nothing stored, an empty append says the transcript is empty, not that it does
    not continue a stored conversation."""
    r = client.post(f"{CONV}-new/messages", json=body([], model))
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "empty" in message and "does not continue" not in message, message
