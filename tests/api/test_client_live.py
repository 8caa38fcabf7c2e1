"""The Python client against a live server (uvicorn on a free port, the suite's Redis): every
method, typed errors with the server's message, tenant isolation, ids it cannot send, and a
prepare that waits longer than the client's timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from api.app import create_app
from shared.client import AsyncPrefitClient, PrefitClient
from shared.errors import InvalidId, InvalidTranscript, LengthMismatch, NotFound, UnknownModel
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.server import serve
from tests.api.test_refusals import dump
from tests.builders import assistant, chat, user

pytestmark = pytest.mark.anyio


@pytest.fixture
def two(redis_url: str, tenant: str, model: str) -> Settings:
    """Settings with the test's tenant and a second one, `<tenant>b`."""
    keys = f"{tenant}:{key_of(tenant)},{tenant}b:{key_of(tenant + 'b')}"
    return make_settings(redis_url, model, api_keys=keys)


@pytest.fixture
def url(two: Settings, store: Store) -> Iterator[str]:
    """A live API with no workers (summaries never land: prepares over the trigger are stale)."""
    with serve(create_app(two, store=store, enqueue=Recorder())) as base:
        yield base


def test_every_method_and_typed_errors(url: str, tenant: str, model: str) -> None:
    """append, replace, get, prepare, prepare_messages, observe, delete work; errors are typed
    and carry the server's message."""
    with PrefitClient(url, key_of(tenant)) as a:
        assert a.append("c1", chat(1), model=model).length == 3
        assert a.append("c1", [user("more")], model=model, expected_length=3).length == 4
        with pytest.raises(LengthMismatch) as mismatch:
            a.append("c1", [user("x")], model=model, expected_length=1)
        assert (mismatch.value.expected, mismatch.value.actual) == (1, 4)
        assert a.replace("c1", [*chat(1), user("q"), assistant("a")], model=model).length == 5
        assert a.get("c1").length == 5
        assert a.prepare("c1", model=model).report["changed"] is False
        sent = a.prepare_messages(chat(1), model=model)
        a.observe(model=model, messages=sent.messages, actual_prompt_tokens=sent.tokens + 5)
        with pytest.raises(UnknownModel, match="no input window is configured for model 'x'"):
            a.prepare("c1", model="x")
        with pytest.raises(InvalidTranscript) as bad:
            a.append("c1", [{"role": "wizard", "content": "x"}], model=model)
        assert bad.value.index == 0 and "unknown role 'wizard'" in str(bad.value)
        a.delete("c1")
        with pytest.raises(NotFound, match="conversation 'c1' not found"):
            a.get("c1")


def test_tenant_b_cannot_read_overwrite_or_delete_a(url: str, tenant: str, model: str) -> None:
    """Same id, two tenants: each sees only its own conversation, whatever the other does."""
    with PrefitClient(url, key_of(tenant)) as a, PrefitClient(url, key_of(tenant + "b")) as b:
        a.append("same", chat(2), model=model)
        with pytest.raises(NotFound):
            b.get("same")
        b.delete("same")
        b.replace("same", [user("b's own")], model=model)
        assert a.get("same").length == 5 and b.get("same").length == 1
        assert [m["content"] for m in b.prepare("same", model=model).messages] == ["b's own"]


@pytest.mark.parametrize("bad", ["..", ".", "a/b"])
def test_an_id_that_would_leave_the_route_sends_nothing(
    bad: str, url: str, store: Store, tenant: str, model: str
) -> None:
    """'..' would be resolved into POST /v1/messages (the Anthropic proxy): refused locally."""
    before = dump(store.client, tenant)
    with PrefitClient(url, key_of(tenant)) as a, pytest.raises(InvalidId):
        a.append(bad, [user("x")], model=model)
    assert dump(store.client, tenant) == before


def test_a_prepare_may_wait_longer_than_the_client_timeout(
    url: str, tenant: str, model: str
) -> None:
    """wait_ms 1200 with a 0.5 s timeout: the client waits for the answer (stale, waited)."""
    # the write, whose first count took 550 ms on a loaded CI machine, is not what is tested
    with PrefitClient(url, key_of(tenant)) as writer:
        assert writer.replace("long", chat(60, 600), model=model).state == "over"
    with PrefitClient(url, key_of(tenant), timeout=0.5, retries=0) as a:
        started = time.monotonic()
        report = a.prepare("long", model=model, wait_ms=1200).report
    assert report["stale"] is True and report["waited_ms"] >= 1200
    assert 1.2 <= time.monotonic() - started < 3.0


async def test_the_async_client_waits_too(url: str, tenant: str, model: str) -> None:
    """The async client's waiting prepare outlives its timeout the same way."""
    async with AsyncPrefitClient(url, key_of(tenant)) as writer:
        await writer.replace("long", chat(60, 600), model=model)
    async with AsyncPrefitClient(url, key_of(tenant), timeout=0.5, retries=0) as a:
        report = (await a.prepare("long", model=model, wait_ms=900)).report
    assert report["stale"] is True and float(str(report["waited_ms"])) >= 900
