"""The OpenAI Responses dialect (`POST /v1/responses`, `POST /v1/responses/input_tokens`).

`instructions` and `input` are converted losslessly to prefit's format
(shared/formats/responses.py) and the fitted prompt back; every other field (`store`,
`include`, `reasoning`, `tools`, `prompt_cache_key`, `truncation`, ...) rides along. The
tool specs are flat (`{"type": "function", "name", "parameters"}`, custom, local_shell,
...) and count toward the budget as they are sent. The prompt count is `usage.input_tokens`
(cached tokens included), in a streamed answer that of `response.completed` (or of
`response.incomplete` / `response.failed`, which carry it too). Overflows, errors and auth
are OpenAI's, as on chat; OpenAI may also report an overflow inside a stream it opened
(`response.failed` right after `response.created`), so the events before the output are
read ahead to retry it as well.

A request that continues server-side state (`previous_response_id`, `conversation`) holds
only the new items: prefit cannot see, nor fit, what the provider adds to it, so it goes
upstream unchanged and `x-prefit-fit` says `skipped (server-side state: <field>)`.

Stored responses belong to the tenant that created them. With the deployment's key the
provider sees one account, so prefit records the id of every response a tenant's
`POST /v1/responses` created (the answer's `id`; in a stream, `response.created`'s, read
ahead before any event is passed on), for OpenAI's retention of 30 days
(shared/store/ownership.py), and answers any other id the provider's 404 without asking it:
retrieve, delete, input items and cancel (api/proxy/routes.py), and a `previous_response_id`
(400, as OpenAI answers an unknown one). A `conversation` names an OpenAI conversation,
which only `POST /v1/conversations` makes, and prefit does not pass that through: with the
deployment's key every one is another's, so it is refused the same way. With the client's
own provider key the provider keeps them apart itself, and nothing is checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Response

from api.deps import Services
from api.proxy.dialects import tools_of
from api.proxy.dialects.openai import OpenAIDialect
from api.proxy.endpoints import PROVIDER_ID
from api.proxy.overflow import Overflow
from api.proxy.relay import CountRelay, Fit, Relay
from api.proxy.streaming import OpenedStream, Tap, data_of, error_event
from api.proxy.upstream import own_key
from shared.errors import InvalidRequest, InvalidTranscript, NotFound, StoreUnavailable
from shared.formats.responses import read_responses, to_responses
from shared.logs import get_logger
from shared.messages import Message, ToolSpec

if TYPE_CHECKING:  # it holds the dialects: it imports this module
    from api.proxy.services import ProxyServices

log = get_logger(__name__)

STATE_FIELDS = ("previous_response_id", "conversation")
RESPONSES = "responses"  # the kind of owned object (shared/store/keys.py `owned`)
RETENTION_S = 30 * 86_400  # OpenAI keeps a stored response 30 days
# what a stream sends before the model's output starts (or it fails)
_PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_EVENT = re.compile(rb"^event:[ \t]*(\S+)", re.M)
# the events whose `response` carries the final usage
_FINAL = re.compile(rb"response\.(?:completed|incomplete|failed)")


def input_tokens(usage: Any) -> int | None:
    """The prompt's tokens in a Responses `usage` object."""
    found = usage.get("input_tokens") if isinstance(usage, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


class CompletedTap:
    """Reads the prompt count from the final event's `response.usage`; keeps every event."""

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None

    def keep(self, event: bytes) -> bool:
        if self.prompt_tokens is None and _FINAL.search(event) is not None:
            data = data_of(event)
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict):
                self.prompt_tokens = input_tokens(response.get("usage"))
        return True


class ResponsesDialect(OpenAIDialect):
    """OpenAI Responses: OpenAI's upstream, auth, overflows and errors; its own body."""

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        if "input" not in body:
            raise InvalidTranscript("'input' is missing")
        messages, origins = read_responses(body.get("instructions"), body["input"])
        try:
            messages = check(messages)
        except InvalidTranscript as exc:  # say which input item, not which converted message
            at = origins[exc.index] if exc.index is not None and exc.index < len(origins) else None
            raise InvalidTranscript(
                exc.reason, at if at is not None and at >= 0 else None
            ) from None
        return messages, tools_of(body)

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        items: Any = to_responses(messages)
        given = body.get("input")
        if isinstance(given, str) and items == [{"role": "user", "content": given}]:
            items = given
        return {**body, "input": items}

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        return None, False  # response.completed always carries the usage

    def tap(self, strip: bool) -> Tap:
        return CompletedTap()

    def prompt_tokens(self, answer: Any) -> int | None:
        return input_tokens(answer.get("usage")) if isinstance(answer, dict) else None

    def counted(self, answer: Any) -> int | None:
        return input_tokens(answer)  # `{"object": "response.input_tokens", "input_tokens": N}`


def event_type(event: bytes) -> str | None:
    """The type of one server-sent event: its `event:` line's, else its data's `type`."""
    found = _EVENT.search(event)
    if found is not None:
        return found.group(1).decode(errors="replace")
    data = data_of(event)
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def server_state(body: Mapping[str, Any]) -> str | None:
    """The field by which `body` continues state held by the provider, if any."""
    return next((f for f in STATE_FIELDS if body.get(f) not in (None, "")), None)


async def owned_response(
    svc: Services, proxy: ProxyServices, tenant: str, response_id: str
) -> None:
    """`NotFound` (OpenAI's words) unless `tenant` created `response_id` through prefit."""
    client = svc.increments().client
    if not await proxy.owned.owns(client, tenant, RESPONSES, response_id, RETENTION_S):
        raise NotFound(f"Response with id '{response_id}' not found.")


class ResponsesRelay(Relay):
    """One `POST /v1/responses`: fitted unless it continues server-side state; the
    response it creates recorded as the tenant's, and the responses it continues checked
    to be its own."""

    created: str | None = None  # the id of the response the answer created, once read

    async def run(self) -> Response:
        await self._check_references()
        answer = await super().run()
        await self._own(self.created)
        return answer

    async def _check_references(self) -> None:
        """`InvalidRequest` for a `previous_response_id` the tenant did not create or a
        `conversation`, when the deployment's key goes upstream (module docstring)."""
        if own_key(self.dialect, self.caller):
            return
        previous = self.body.get("previous_response_id")
        if previous not in (None, ""):
            owned = isinstance(previous, str) and PROVIDER_ID.fullmatch(previous) is not None
            client = self.svc.increments().client
            if not owned or not await self.proxy.owned.owns(
                client, self.caller.tenant, RESPONSES, str(previous), RETENTION_S
            ):
                raise InvalidRequest(f"Previous response with id '{str(previous)[:80]}' not found.")
        if self.body.get("conversation") not in (None, ""):
            raise InvalidRequest(
                "conversation not found: prefit's proxy serves no OpenAI conversations "
                "(/v1/conversations is prefit's own API), so none belongs to this key"
            )

    async def _own(self, response_id: str | None) -> None:
        """Record `response_id` as the tenant's (a fault: logged; it stays unreachable)."""
        self.created = None
        if response_id is None or not PROVIDER_ID.fullmatch(response_id):
            return
        client = self.svc.increments().client
        try:
            await self.proxy.owned.record(
                client, self.caller.tenant, RESPONSES, response_id, RETENTION_S
            )
        except StoreUnavailable:
            log.warning("proxy.owner_unrecorded", tenant=self.caller.tenant, kind=RESPONSES)

    def _answered(
        self, upstream: httpx.Response, content: bytes, answer: Any, fit: Fit | None
    ) -> Response:
        if upstream.status_code < 300 and isinstance(answer, dict):
            found = answer.get("id")
            self.created = found if isinstance(found, str) else None
        return super()._answered(upstream, content, answer, fit)

    async def _first_fit(self) -> Fit | None:
        state = server_state(self.body)
        if state is not None:
            return self._skip(f"server-side state: {state}")
        return await super()._first_fit()

    def _broken(self) -> bytes:
        """The `error` event ending a stream the provider broke off: the Responses API's
        own error event (`type`, `code`, `message`: what Codex reads) that also carries
        `error` (what the SDK raises from)."""
        error = self.dialect.error(502, f"{self.dialect.name} upstream broke off the stream")
        return error_event({**error["error"], "type": "error", "error": error["error"]})

    async def _stream_overflow(self, opened: OpenedStream) -> Overflow | None:
        """OpenAI may refuse a streamed request over the window in the stream itself: a
        `response.failed` event whose error is `context_length_exceeded`, after
        `response.created`. The events before the output are read ahead to see it."""
        first = await opened.until(lambda e: event_type(e) not in _PREAMBLE)
        await self._own(created_id(opened.read))  # before the client sees the id
        if first is None or event_type(first) != "response.failed":
            return None
        data = data_of(first)
        response = data.get("response") if isinstance(data, dict) else None
        error = response.get("error") if isinstance(response, dict) else None
        return self.dialect.overflow(400, {"error": error})


def created_id(events: list[bytes]) -> str | None:
    """The id of the response a stream's `response.created` event announces, if read."""
    for event in events:
        if event_type(event) == "response.created":
            data = data_of(event)
            response = data.get("response") if isinstance(data, dict) else None
            found = response.get("id") if isinstance(response, dict) else None
            return found if isinstance(found, str) else None
    return None


class ResponsesCountRelay(CountRelay, ResponsesRelay):
    """One `POST /v1/responses/input_tokens`: fitted as `/v1/responses` is, then counted
    (a `previous_response_id` checked as `ResponsesRelay` checks it)."""

    async def run(self) -> Response:
        await self._check_references()
        return await CountRelay.run(self)
