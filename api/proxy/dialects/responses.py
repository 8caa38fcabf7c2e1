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

Stored responses belong to the tenant that created them (api/proxy/owners.py): the
response a request creates is recorded as its tenant's (in a stream, from
`response.created`, read ahead before the client sees it), and a `previous_response_id` or
`conversation` it names is checked to be the tenant's before anything goes upstream.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from fastapi import Response

from api.codec import dumps
from api.proxy.compaction import HEADER, CompactRelay, expand, server_state, triggered
from api.proxy.dialects import tools_of
from api.proxy.dialects.openai import OpenAIDialect
from api.proxy.overflow import Overflow
from api.proxy.owners import check_references, output_ids, own_response
from api.proxy.relay import CountRelay, Fit, Relay
from api.proxy.streaming import OpenedStream, Tap, data_of, error_event
from shared.errors import InvalidTranscript
from shared.formats.responses import read_responses, to_responses
from shared.messages import Message, ToolSpec

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
    """Reads the prompt count from the final event's `response.usage` (and its output
    items' ids); keeps every event."""

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.items: list[str] = []  # the final response's output item ids (api/proxy/owners.py)

    def keep(self, event: bytes) -> bool:
        if self.prompt_tokens is None and _FINAL.search(event) is not None:
            data = data_of(event)
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict):
                self.prompt_tokens = input_tokens(response.get("usage"))
                self.items = output_ids(response)
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


class ResponsesRelay(Relay):
    """One `POST /v1/responses`: fitted unless it continues server-side state; the
    response it creates recorded as the tenant's, the responses it continues checked to be
    its own."""

    created: str | None = None  # the id of the response the answer created, once read
    items: list[str] | None = None  # its output items' ids (unstreamed answers)

    async def run(self) -> Response:
        if triggered(self.body):  # Codex's compaction turn: answered by prefit (which checks)
            return await CompactRelay.triggered_by(self).run()
        await check_references(self.svc, self.proxy, self.dialect, self.caller, self.body)
        answer = await super().run()
        await self._own(self.created, self.items)
        return answer

    async def _own(self, response_id: str | None, items: list[str] | None = None) -> None:
        self.created, self.items = None, None
        await own_response(self.svc, self.proxy, self.caller.tenant, response_id, items)

    def _streamed(
        self, upstream: httpx.Response, fit: Fit | None, opened: OpenedStream
    ) -> Response:
        answer = super()._streamed(upstream, fit, opened)
        if isinstance(self.tap, CompletedTap):  # its items are known once the stream ended
            self.background.add_task(self._own_items, self.tap)
        return answer

    async def _own_items(self, tap: CompletedTap) -> None:
        await own_response(self.svc, self.proxy, self.caller.tenant, None, tap.items)

    def _answered(
        self, upstream: httpx.Response, content: bytes, answer: Any, fit: Fit | None
    ) -> Response:
        if upstream.status_code < 300 and isinstance(answer, dict):
            found = answer.get("id")
            self.created = found if isinstance(found, str) else None
            self.items = output_ids(answer)
        return super()._answered(upstream, content, answer, fit)

    async def _first_fit(self) -> Fit | None:
        expanded = await expand(self.svc, self.caller.tenant, self.body)
        if expanded is not None:  # prefit's compaction items: the provider never sees them
            self.body, self.raw = expanded.body, dumps(expanded.body)
            self.headers = expanded.named(self.headers)
            self.headers_out[HEADER] = expanded.outcome
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
    (what it names checked as `ResponsesRelay` checks it)."""

    async def run(self) -> Response:
        await check_references(self.svc, self.proxy, self.dialect, self.caller, self.body)
        return await CountRelay.run(self)
