"""Syncing the store to a proxied transcript: O(new) appends, replace only for edits."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from api.conversations import Conversations
from api.deps import Services
from api.policies import resolve_window
from api.proxy.transcripts import stored_prefix, sync
from tests.api.helpers import assistant, chat, conv_id, user


@pytest.fixture
def svc(app: FastAPI) -> Services:
    found: Services = app.state.services
    return found


@pytest.fixture
def replaces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of the transcripts written by replace (appends are not recorded)."""
    seen: list[int] = []
    original = Conversations.replace

    def spy(self: Conversations, tenant: str, cid: str, req: Any, window: Any) -> Any:
        seen.append(len(req.messages))
        return original(self, tenant, cid, req, window)

    monkeypatch.setattr(Conversations, "replace", spy)
    return seen


def test_a_stale_stored_length_still_appends_only_what_is_missing(
    svc: Services, tenant: str, model: str, replaces: list[int]
) -> None:
    """The previous turn's sync landed after this request read the store: no replace."""
    window = resolve_window(svc.settings, model, None)
    cid, messages = conv_id(), chat(6)
    assert sync(svc, tenant, cid, messages[:9], stored_length=0, window=window, tools=[])
    grown = [*messages, assistant("a"), user("b")]
    sizes = sync(svc, tenant, cid, grown, stored_length=5, window=window, tools=[])  # stale
    assert sizes is not None and sizes.length == len(grown)
    assert svc.store.conversations.read(tenant, cid) == grown
    assert replaces == []
    assert sync(svc, tenant, cid, grown, stored_length=len(grown), window=window, tools=[]) is None


def test_an_edited_transcript_replaces_the_stored_one(
    svc: Services, tenant: str, model: str, replaces: list[int]
) -> None:
    """A regenerated last answer is no prefix of what is stored: the request's replaces it."""
    window = resolve_window(svc.settings, model, None)
    cid, messages = conv_id(), chat(6)
    sync(svc, tenant, cid, messages, stored_length=0, window=window, tools=[])
    edited = [*messages[:-1], assistant("another answer")]
    assert stored_prefix(svc, tenant, cid, edited) is None
    assert stored_prefix(svc, tenant, cid, [*messages, user("more")]) == len(messages)
    assert stored_prefix(svc, tenant, conv_id(), messages) == 0
    sync(svc, tenant, cid, edited, stored_length=None, window=window, tools=[])
    assert svc.store.conversations.read(tenant, cid) == edited
    assert replaces == [len(edited)]
