"""Syncing the store to a proxied transcript: O(new) appends, replace only for edits."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from api.deps import Services
from api.policies import resolve_window
from api.proxy.relay import sync
from shared.errors import InvalidTranscript
from shared.store.writes import Writes
from tests.api.helpers import conv_id
from tests.builders import assistant, call, chat, user


@pytest.fixture
def svc(app: FastAPI) -> Services:
    found: Services = app.state.services
    return found


@pytest.fixture
def replaces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of the transcripts written whole (appends are not recorded)."""
    seen: list[int] = []
    original = Writes.replace

    def spy(self: Writes, tenant: str, cid: str, whole: Any) -> Any:
        seen.append(len(whole.messages))
        return original(self, tenant, cid, whole)

    monkeypatch.setattr(Writes, "replace", spy)
    return seen


def test_a_grown_transcript_appends_only_what_is_new(
    svc: Services, tenant: str, model: str, replaces: list[int]
) -> None:
    """Each turn resends everything; once stored, only the new messages are written."""
    window = resolve_window(svc.settings, model, None)
    cid, messages = conv_id(), chat(6)
    assert sync(svc, tenant, cid, messages[:9], window=window, tools=[]).length == 9
    grown = [*messages, assistant("a"), user("b")]
    sizes = sync(svc, tenant, cid, grown, window=window, tools=[])
    assert sizes.length == len(grown)
    assert svc.store.conversations.read(tenant, cid) == grown
    assert replaces == [9]  # the first sync created it; the second appended
    assert sync(svc, tenant, cid, grown, window=window, tools=[]).length == len(grown)
    assert replaces == [9]


def test_an_edited_transcript_replaces_the_stored_one(
    svc: Services, tenant: str, model: str, replaces: list[int]
) -> None:
    """A regenerated last answer is no prefix of what is stored: the request's replaces it."""
    window = resolve_window(svc.settings, model, None)
    cid, messages = conv_id(), chat(6)
    sync(svc, tenant, cid, messages, window=window, tools=[])
    edited = [*messages[:-1], assistant("another answer")]
    sync(svc, tenant, cid, edited, window=window, tools=[])
    assert svc.store.conversations.read(tenant, cid) == edited
    assert replaces == [len(messages), len(edited)]


def test_a_malformed_transcript_is_never_stored(svc: Services, tenant: str, model: str) -> None:
    """A request forwarded unchecked (under the trigger) cannot store a shape providers reject."""
    window = resolve_window(svc.settings, model, None)
    cid = conv_id()
    with pytest.raises(InvalidTranscript):
        sync(svc, tenant, cid, [user("go"), call("c1"), user("and?")], window=window, tools=[])
    assert not svc.store.conversations.exists(tenant, cid)
