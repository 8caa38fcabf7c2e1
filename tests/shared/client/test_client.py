"""The HTTP client against httpx.MockTransport: requests, typed results, retries, typed errors."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shared.client import (
    AppendResult,
    AsyncPrefitClient,
    ConversationInfo,
    PrefitClient,
    PreparedPrompt,
    SummaryInfo,
)
from shared.client import aio as aio_module
from shared.client import sync as sync_module
from shared.errors import (
    ConfigError,
    DoesNotFit,
    InvalidId,
    InvalidRequest,
    InvalidTranscript,
    LengthMismatch,
    NotFound,
    PrefitError,
    ServiceUnavailable,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
    UnknownModel,
)

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]
APPENDED = {
    "conversation_id": "c1",
    "length": 3,
    "tokens": 42,
    "effective_tokens": 30,
    "state": "under",
}
PREPARED: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hi"}],
    "tokens": 5,
    "report": {"changed": False},
}


class Recorder:
    """A fake service: answers from a list of responses (or a handler) and records requests."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def body(self, k: int = -1) -> Any:
        return json.loads(self.requests[k].content)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record retry sleeps instead of sleeping."""
    waited: list[float] = []
    monkeypatch.setattr(sync_module, "_sleep", waited.append)
    return waited


def _client(rec: Recorder, **kw: Any) -> PrefitClient:
    return PrefitClient("http://prefit.test/", "key-1", transport=httpx.MockTransport(rec), **kw)


def _error(status: int, type_: str, message: str = "m", **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": type_, "message": message, **extra}})


def test_append_sends_the_contract_body_and_parses_the_result() -> None:
    """append POSTs messages, model, expected_length with the bearer key; returns AppendResult."""
    rec = Recorder(httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        msgs = [{"role": "user", "content": "hi"}]
        result = c.append("Chat-1.v2_x", msgs, model="m", expected_length=2, max_input_tokens=1000)
    assert result == AppendResult("c1", 3, 42, 30, "under")
    req = rec.requests[0]
    assert (req.method, req.url.raw_path) == ("POST", b"/v1/conversations/Chat-1.v2_x/messages")
    assert req.headers["Authorization"] == "Bearer key-1"
    assert rec.body() == {
        "messages": msgs,
        "model": "m",
        "expected_length": 2,
        "max_input_tokens": 1000,
    }


def test_anthropic_format_sends_system_and_returns_it() -> None:
    """format='anthropic' is sent with system; the prepared prompt carries the system back."""
    rec = Recorder(
        httpx.Response(200, json=APPENDED), httpx.Response(200, json={**PREPARED, "system": "s"})
    )
    with _client(rec) as c:
        c.replace("c1", [], model="m", format="anthropic", system="s", tools=[{"name": "t"}])
        prepared = c.prepare("c1", model="m", format="anthropic", wait_ms=50)
    assert rec.requests[0].method == "PUT"
    assert rec.body(0) == {
        "messages": [],
        "model": "m",
        "system": "s",
        "tools": [{"name": "t"}],
        "format": "anthropic",
    }
    assert rec.body(1) == {"model": "m", "pressure": 1.0, "wait_ms": 50, "format": "anthropic"}
    assert prepared == PreparedPrompt(PREPARED["messages"], 5, {"changed": False}, "s")


def test_system_without_anthropic_format_is_refused_before_sending() -> None:
    """A system prompt with the OpenAI format is a ConfigError and nothing is sent."""
    rec = Recorder(httpx.Response(200, json=APPENDED))
    with _client(rec) as c, pytest.raises(ConfigError):
        c.append("c1", [], model="m", system="s")
    assert rec.requests == []


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "a:b", "{x}", "", "é", "-a", "x" * 129])
def test_an_id_the_service_refuses_is_refused_before_sending(bad: str) -> None:
    """Ids outside the service's alphabet raise InvalidId and send nothing: '..' would
    otherwise be resolved by httpx into POST /v1/messages, the Anthropic proxy."""
    rec = Recorder(httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        for method in (c.get, c.delete):
            with pytest.raises(InvalidId, match="invalid conversation id"):
                method(bad)
        with pytest.raises(InvalidId):
            c.append(bad, [{"role": "user", "content": "x"}], model="m")
        with pytest.raises(InvalidId):
            c.prepare(bad, model="m")
    assert rec.requests == []


def test_prepare_waiting_extends_the_read_timeout_by_wait_ms() -> None:
    """A prepare that lets the service wait `wait_ms` reads for that much longer, so the
    wait is not cut by the client's timeout (and then repeated by its retries)."""
    rec = Recorder(httpx.Response(200, json=PREPARED))
    with _client(rec, timeout=2.0) as c:
        c.prepare("c1", model="m", wait_ms=5000)
        c.prepare("c1", model="m")
        c.prepare_messages([{"role": "user", "content": "x"}], model="m")
    reads = [r.extensions["timeout"]["read"] for r in rec.requests]
    assert reads == [7.0, 2.0, 2.0]


async def test_async_prepare_waiting_extends_the_read_timeout_by_wait_ms() -> None:
    """The async client reads a waiting prepare for `wait_ms` longer too."""
    rec = Recorder(httpx.Response(200, json=PREPARED))

    transport = httpx.MockTransport(rec)
    async with AsyncPrefitClient("http://p.test", timeout=1.0, transport=transport) as c:
        await c.prepare("c1", model="m", wait_ms=2500)
    assert rec.requests[0].extensions["timeout"]["read"] == 3.5


def test_prepare_without_wait_ms_leaves_the_wait_to_the_service() -> None:
    """No wait_ms is sent unless given, so the operator's PREFIT_DEFAULT_WAIT_MS applies
    (an explicit 0 would turn it off for every client user); a given 0 is sent."""
    rec = Recorder(httpx.Response(200, json=PREPARED))
    with _client(rec) as c:
        c.prepare("c1", model="m")
        c.prepare("c1", model="m", wait_ms=0)
    assert rec.body(0) == {"model": "m", "pressure": 1.0}
    assert rec.body(1) == {"model": "m", "pressure": 1.0, "wait_ms": 0}


@pytest.mark.parametrize("pressure", [float("nan"), float("inf")])
def test_a_pressure_that_is_not_json_is_a_typed_error(pressure: float) -> None:
    """NaN or infinite pressure raises InvalidRequest (not a bare ValueError), sending nothing."""
    rec = Recorder(httpx.Response(200, json=PREPARED))
    with _client(rec) as c:
        with pytest.raises(InvalidRequest, match="pressure"):
            c.prepare("c1", model="m", pressure=pressure)
        with pytest.raises(InvalidRequest, match="pressure"):
            c.prepare_messages([{"role": "user", "content": "x"}], model="m", pressure=pressure)
    assert rec.requests == []


def test_get_delete_prepare_messages_and_observe() -> None:
    """The remaining routes: methods, paths, bodies and parsed results."""
    info = {
        "conversation_id": "c1",
        "length": 9,
        "tokens": 900,
        "effective_tokens": 400,
        "model": "m",
        "summaries": [
            {
                "upto": 5,
                "prefix_hash": "v1:ab",
                "tokens": 40,
                "age_s": 1.5,
                "summarizer": "extractive",
            }
        ],
    }
    rec = Recorder(
        httpx.Response(200, json=info),
        httpx.Response(204),
        httpx.Response(200, json=PREPARED),
        httpx.Response(204),
        httpx.Response(204),
    )
    msgs = [{"role": "user", "content": "hi"}]
    with _client(rec) as c:
        got = c.get("c1")
        c.delete("c1")
        c.prepare_messages(msgs, model="m", pressure=0.5)
        c.observe(model="m", messages=msgs, actual_prompt_tokens=7)
        c.observe(model="m", messages=msgs, actual_prompt_tokens=8, format="anthropic", system="s")
    assert got == ConversationInfo(
        "c1", 9, 900, 400, "m", (SummaryInfo(5, "v1:ab", 40, 1.5, "extractive"),)
    )
    assert [(r.method, r.url.path) for r in rec.requests] == [
        ("GET", "/v1/conversations/c1"),
        ("DELETE", "/v1/conversations/c1"),
        ("POST", "/v1/prepare"),
        ("POST", "/v1/observe"),
        ("POST", "/v1/observe"),
    ]
    assert rec.body(2) == {"messages": msgs, "model": "m", "pressure": 0.5}
    assert rec.body(3) == {"model": "m", "messages": msgs, "actual_prompt_tokens": 7}
    assert rec.body(4) == {
        "model": "m",
        "messages": msgs,
        "actual_prompt_tokens": 8,
        "format": "anthropic",
        "system": "s",
    }


def test_503_is_retried_honouring_retry_after(sleeps: list[float]) -> None:
    """A 503 with Retry-After is retried after exactly that many seconds, then succeeds."""
    busy = httpx.Response(
        503,
        headers={"Retry-After": "2"},
        json={"error": {"type": "StoreUnavailable", "message": "down"}},
    )
    rec = Recorder(busy, busy, httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        assert c.append("c1", [], model="m").length == 3
    assert sleeps == [2.0, 2.0]
    assert len(rec.requests) == 3


def test_an_hour_long_retry_after_is_not_slept(sleeps: list[float]) -> None:
    """A Retry-After past a minute (a misconfigured proxy in front) is replaced by the
    client's own backoff instead of blocking the caller for an hour."""
    busy = httpx.Response(
        503,
        headers={"Retry-After": "3600"},
        json={"error": {"type": "StoreUnavailable", "message": "down"}},
    )
    rec = Recorder(busy, httpx.Response(200, json=APPENDED))
    with _client(rec, backoff=0.1) as c:
        assert c.append("c1", [], model="m").length == 3
    assert len(sleeps) == 1 and sleeps[0] <= 0.1


def test_replace_sends_the_expected_length() -> None:
    """`replace(..., expected_length=n)` asks the service to refuse an edit of a transcript
    that changed since it was read; without it the field is not sent."""
    rec = Recorder(httpx.Response(200, json=APPENDED), httpx.Response(200, json=APPENDED))
    msgs = [{"role": "user", "content": "hi"}]
    with _client(rec) as c:
        c.replace("c1", msgs, model="m", expected_length=4)
        c.replace("c1", msgs, model="m")
    assert rec.body(0)["expected_length"] == 4
    assert "expected_length" not in rec.body(1)


def test_persistent_503_becomes_store_unavailable(sleeps: list[float]) -> None:
    """After `retries` retries a 503 raises StoreUnavailable; backoff grows without Retry-After."""
    rec = Recorder(_error(503, "StoreUnavailable", "redis down"))
    with (
        _client(rec, retries=2, backoff=0.1) as c,
        pytest.raises(StoreUnavailable, match="redis down"),
    ):
        c.get("c1")
    assert len(rec.requests) == 3
    assert 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2


def test_refused_connections_are_retried_for_any_call(sleeps: list[float]) -> None:
    """A connect error (nothing sent) is retried even for a plain append."""
    rec = Recorder(httpx.ConnectError("refused"), httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        assert c.append("c1", [], model="m").state == "under"
    assert len(rec.requests) == 2 and len(sleeps) == 1


def test_an_append_that_may_have_landed_is_not_repeated(sleeps: list[float]) -> None:
    """A read timeout on an append without expected_length is not retried (no double append),
    and the error says the append may have landed rather than that the service is down."""
    rec = Recorder(httpx.ReadTimeout("slow"), httpx.Response(200, json=APPENDED))
    with _client(rec) as c, pytest.raises(ServiceUnavailable, match="may have been applied"):
        c.append("c1", [], model="m")
    assert len(rec.requests) == 1 and sleeps == []


def test_an_append_with_expected_length_is_repeated_after_a_timeout(sleeps: list[float]) -> None:
    """With expected_length a repeat is harmless (409 at worst), so it is retried."""
    rec = Recorder(httpx.ReadTimeout("slow"), httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        assert c.append("c1", [], model="m", expected_length=0).length == 3
    assert len(rec.requests) == 2


def test_unreachable_service_raises_after_retries(sleeps: list[float]) -> None:
    """A service that never answers raises ServiceUnavailable naming it, after retries+1 tries."""
    rec = Recorder(httpx.ConnectError("refused"))
    with _client(rec, retries=1) as c, pytest.raises(ServiceUnavailable, match=r"prefit\.test"):
        c.prepare("c1", model="m")
    assert len(rec.requests) == 2


@pytest.mark.parametrize(
    ("response", "cls", "fields"),
    [
        (
            _error(409, "LengthMismatch", expected=3, actual=5),
            LengthMismatch,
            {"expected": 3, "actual": 5},
        ),
        (_error(404, "NotFound"), NotFound, {}),
        (
            _error(422, "InvalidTranscript", "message 4: bad role", index=4),
            InvalidTranscript,
            {"index": 4, "reason": "bad role"},
        ),
        (_error(401, "Unauthorized"), Unauthorized, {}),
        (_error(413, "TooLarge"), TooLarge, {}),
        (_error(400, "UnknownModel", "no window for m"), UnknownModel, {}),
        (
            _error(400, "DoesNotFit", tokens=9, budget=5, head_tokens=3, tail_tokens=6),
            DoesNotFit,
            {"tokens": 9, "budget": 5, "head_tokens": 3, "tail_tokens": 6},
        ),
        (httpx.Response(422, json={"detail": "pydantic"}), InvalidTranscript, {"index": None}),
        (httpx.Response(404, text="<html>"), NotFound, {}),
        (_error(400, "SomethingNew"), PrefitError, {}),
        (httpx.Response(500, text="oops"), PrefitError, {}),
    ],
)
def test_error_bodies_map_to_typed_errors(
    response: httpx.Response, cls: type[PrefitError], fields: dict[str, Any]
) -> None:
    """Each error body becomes its shared/errors.py class, with the body's fields."""
    with _client(Recorder(response)) as c, pytest.raises(PrefitError) as err:
        c.get("c1")
    assert type(err.value) is cls
    for name, value in fields.items():
        assert getattr(err.value, name) == value


def test_a_malformed_success_body_is_a_prefit_error() -> None:
    """A 200 without the contract's fields raises PrefitError, not KeyError."""
    with (
        _client(Recorder(httpx.Response(200, json={"length": 1}))) as c,
        pytest.raises(PrefitError, match="unexpected"),
    ):
        c.append("c1", [], model="m")


def test_health_reports_without_raising() -> None:
    """health() is ok on 200 and reports status 0 when nothing answers."""
    with _client(Recorder(httpx.Response(200, json={"status": "ok"}))) as c:
        assert c.health().ok and c.health().detail == {"status": "ok"}
    with _client(Recorder(httpx.ConnectError("refused"))) as c:
        health = c.health()
    assert (health.ok, health.status) == (False, 0)


async def test_async_client_has_the_same_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    """AsyncPrefitClient retries a 503, parses results and raises typed errors."""
    waited: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(aio_module, "_async_sleep", fake_sleep)
    rec = Recorder(
        _error(503, "StoreUnavailable"),
        httpx.Response(200, json=APPENDED),
        httpx.Response(200, json=PREPARED),
        _error(409, "LengthMismatch", expected=1, actual=3),
        httpx.Response(200, json={"status": "ok"}),
    )

    async with AsyncPrefitClient("http://prefit.test", transport=httpx.MockTransport(rec)) as c:
        assert (await c.append("c1", [], model="m")).tokens == 42
        assert (await c.prepare("c1", model="m")).tokens == 5
        with pytest.raises(LengthMismatch) as err:
            await c.append("c1", [], model="m", expected_length=1)
        assert err.value.actual == 3
        assert (await c.health()).ok
    assert len(waited) == 1
    assert "Authorization" not in rec.requests[0].headers


def test_a_503_whose_outcome_is_unknown_is_not_repeated_for_a_plain_append(
    sleeps: list[float],
) -> None:
    """The request deadline's 503 may still land: a plain append is not sent twice, while an
    append stating expected_length (a repeat is refused, not applied) is retried."""
    late = _error(503, "StoreUnavailable", "no answer within the deadline", outcome="unknown")
    rec = Recorder(late)
    with _client(rec) as c, pytest.raises(StoreUnavailable, match="deadline"):
        c.append("c1", [], model="m")
    assert len(rec.requests) == 1 and sleeps == []
    rec = Recorder(late, httpx.Response(200, json=APPENDED))
    with _client(rec) as c:
        assert c.append("c1", [], model="m", expected_length=2).length == 3
    assert len(rec.requests) == 2


def test_the_client_exposes_every_field_the_api_returns() -> None:
    """Each answer's schema fields are exactly the fields of the client's result type."""
    from api import schemas

    pairs: list[tuple[Any, Any]] = [
        (schemas.ConversationState, AppendResult),
        (schemas.ConversationInfo, ConversationInfo),
        (schemas.SummaryInfo, SummaryInfo),
        (schemas.PrepareResponse, PreparedPrompt),
    ]
    for schema, result in pairs:
        assert set(schema.model_fields) == {f.name for f in dataclasses.fields(result)}


def test_the_clients_are_importable_from_the_package() -> None:
    """`from shared import PrefitClient, AsyncPrefitClient`; the package's names stay sorted."""
    import shared

    assert shared.PrefitClient is PrefitClient
    assert shared.AsyncPrefitClient is AsyncPrefitClient
    assert shared.__all__ == sorted(shared.__all__)
