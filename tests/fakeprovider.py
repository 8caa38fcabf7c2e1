"""A fake OpenAI + Anthropic provider over real HTTP, for the proxy's tests and benchmark.

It serves `POST /v1/chat/completions`, `POST /v1/responses` and `POST /v1/messages` the way
the providers do (the stored-response endpoints of the Responses API answer plausibly),
records every request it receives (path, headers, JSON body), and answers each with, in
order of precedence: the next scripted `Reply`; a context-length error of its protocol, with
the provider's figures, when the prompt is over `limit_tokens`; else an answer whose text
is `words` joined, streamed event by event when the request says `stream: true`. Its usage
counts the prompt as prefit's heuristic counter does, times `scale`, so a test can make
prefit's estimates wrong by a known factor. As a process (the benchmark):

    python -m tests.fakeprovider --port 8901
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from api.proxy.dialects.anthropic import ERROR_TYPES
from shared.counting.counters import HeuristicCounter
from shared.errors import InvalidTranscript
from shared.formats import from_anthropic
from shared.formats.responses import from_responses

WORDS = tuple(f"word{i} " for i in range(12))
_COUNTER = HeuristicCounter()


@dataclass(frozen=True)
class Reply:
    """One scripted answer: an error of the request's protocol unless `status` is 2xx;
    `overflow` makes it a context-length error with figures (`limit` its maximum)."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    overflow: bool = False
    limit: int = 1000
    body: Mapping[str, Any] | None = None  # the error body to answer as it is
    call: tuple[str, str] | None = None  # Responses: answer with this function call (name, args)


@dataclass(frozen=True)
class Received:
    """One request as the fake got it, and the status it answered."""

    protocol: str
    headers: Mapping[str, str]
    body: dict[str, Any]
    status: int  # 400 for an overflow reported inside a 200 stream
    path: str = ""


def prompt_tokens(protocol: str, body: Mapping[str, Any], scale: float = 1.0) -> int:
    """The fake's count of a request's prompt: prefit's heuristic count, times `scale`."""
    messages = body.get("messages") or []
    try:
        if protocol == "anthropic":
            messages = from_anthropic(body.get("system"), messages)
        elif protocol == "responses":
            messages = from_responses(body.get("instructions"), body.get("input"))
        counted = _COUNTER.count(messages, body.get("tools") or [])
    except InvalidTranscript:  # a shape prefit does not know: its size, roughly
        counted = len(json.dumps(body)) // 4
    return math.ceil(counted * scale)


class FakeProvider:
    """The fake's state and its Starlette `app` (serve it with tests/api/server.py)."""

    def __init__(
        self,
        *,
        limit_tokens: int | None = None,
        scale: float = 1.0,
        words: Sequence[str] = WORDS,
        event_delay: float = 0.0,
        record: bool = True,
        compaction: bool = True,
    ) -> None:
        self.limit_tokens = limit_tokens
        self.scale = scale
        self.words = tuple(words)
        self.event_delay = event_delay
        self.record = record
        # False: an upstream without OpenAI's compaction (vLLM, Ollama, a gateway): no
        # /v1/responses/compact route (a plain 404) and a `compaction` input item refused
        self.compaction = compaction
        # a streamed Responses request over the window is refused inside a 200 stream, by a
        # `response.failed` event (recorded as a 400), as OpenAI may do
        self.overflow_in_stream = False
        self.cancelled = 0  # streams whose client went away before the end
        self._received: list[Received] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/responses/input_tokens", self._responses_count, methods=["POST"]),
                *([Route("/v1/responses/compact", self._stored, methods=["POST"])] * compaction),
                Route("/v1/responses/{rid}", self._stored, methods=["GET", "DELETE"]),
                Route("/v1/responses/{rid}/input_items", self._stored, methods=["GET"]),
                Route("/v1/responses/{rid}/cancel", self._stored, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", self._models, methods=["GET"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            ]
        )

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with `replies`, in order."""
        with self._lock:
            self._script.extend(replies)

    async def _openai(self, request: Request) -> Response:
        return await self._handle("openai", request)

    async def _anthropic(self, request: Request) -> Response:
        return await self._handle("anthropic", request)

    async def _responses(self, request: Request) -> Response:
        return await self._handle("responses", request)

    async def _count(self, request: Request, protocol: str = "anthropic") -> Response:
        """Anthropic's token count: the fake's count of the prompt, or the next scripted error."""
        body = json.loads(await request.body())
        with self._lock:
            reply = self._script.pop(0) if self._script else None
        self._note(protocol, request, body, reply.status if reply is not None else 200)
        if reply is not None and reply.status >= 300:
            payload = _error(protocol, reply, 0)
            return JSONResponse(payload, status_code=reply.status, headers=dict(reply.headers))
        counted = {"input_tokens": prompt_tokens(protocol, body, self.scale)}
        if protocol == "responses":
            counted["object"] = "response.input_tokens"  # type: ignore[assignment]
        return JSONResponse(counted)

    async def _responses_count(self, request: Request) -> Response:
        """OpenAI's input token count of a Responses request."""
        return await self._count(request, "responses")

    async def _stored(self, request: Request) -> Response:
        """The Responses API's stored responses and compaction: recorded, answered plausibly."""
        raw = await request.body()
        body = json.loads(raw) if raw else {"query": str(request.url.query)}
        self._note("responses", request, body, 200)
        rid = request.path_params.get("rid", "resp_fake")
        path = request.url.path
        if path.endswith("/input_items"):
            item: dict[str, Any] = {"type": "message", "id": "msg_1", "role": "user"}
            item["content"] = [{"type": "input_text", "text": "hi"}]
            page = {"object": "list", "data": [item], "has_more": False}
            return JSONResponse({**page, "first_id": "msg_1", "last_id": "msg_1"})
        if request.method == "DELETE":
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        if path.endswith("/compact"):
            out = [{"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"}]
            return JSONResponse({"id": "cmp_1", "object": "response.compaction", "output": out})
        status = "cancelled" if path.endswith("/cancel") else "completed"
        return JSONResponse(_response(body, rid, [], 0, 0) | {"status": status})

    async def _models(self, request: Request) -> Response:
        """The model list (or one model), in the shape of the protocol of the request's headers."""
        anthropic = "anthropic-version" in request.headers
        self._note(
            "anthropic" if anthropic else "openai", request, {"query": str(request.url.query)}, 200
        )
        model = request.path_params.get("model_id")
        if anthropic:
            one: dict[str, Any] = {"type": "model", "id": model or "fake-model"}
            one.update(display_name="Fake", created_at="2025-01-01T00:00:00Z")
            if model is not None:
                return JSONResponse(one)
            page = {"data": [one], "has_more": False, "first_id": one["id"], "last_id": one["id"]}
            return JSONResponse(page)
        one = {"id": model or "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
        if model is not None:
            return JSONResponse(one)
        return JSONResponse({"object": "list", "data": [one]}, headers={"x-request-id": "req-m"})

    async def _embeddings(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self._note("openai", request, body, 200)
        item = {"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        return JSONResponse(
            {"object": "list", "data": [item], "model": body.get("model"), "usage": usage}
        )

    def _note(self, protocol: str, request: Request, body: dict[str, Any], status: int) -> None:
        if self.record:
            with self._lock:
                self._received.append(
                    Received(protocol, dict(request.headers), body, status, request.url.path)
                )

    async def _handle(self, protocol: str, request: Request) -> Response:
        body = json.loads(await request.body())
        tokens = prompt_tokens(protocol, body, self.scale)
        with self._lock:
            reply = self._script.pop(0) if self._script else None
        if reply is None and self.limit_tokens is not None and tokens > self.limit_tokens:
            reply = Reply(400, overflow=True, limit=self.limit_tokens)
        if reply is None and protocol == "responses" and not self.compaction:
            reply = _unknown_items(body)
        status = reply.status if reply is not None else 200
        self._note(protocol, request, body, status)
        in_stream = protocol == "responses" and body.get("stream") is True
        if self.overflow_in_stream and in_stream and reply is not None and reply.overflow:
            failed = _responses_failed(body, _error(protocol, reply, tokens)["error"])
            return StreamingResponse(self._paced(failed), media_type="text/event-stream")
        if reply is not None and reply.status >= 300:
            payload = (
                dict(reply.body) if reply.body is not None else _error(protocol, reply, tokens)
            )
            return JSONResponse(payload, status_code=reply.status, headers=dict(reply.headers))
        if protocol == "responses":
            call = reply.call if reply is not None else None
            return self._responses_answer(body, tokens, call)
        if body.get("stream") is True:
            events = _openai_events if protocol == "openai" else _anthropic_events
            stream = self._paced(events(body, self.words, tokens))
            return StreamingResponse(stream, media_type="text/event-stream")
        answer = _openai_answer if protocol == "openai" else _anthropic_answer
        return JSONResponse(answer(body, "".join(self.words), tokens))

    def _responses_answer(
        self, body: Mapping[str, Any], tokens: int, call: tuple[str, str] | None
    ) -> Response:
        output = _responses_output(body, "".join(self.words), call)
        if body.get("stream") is True:
            stream = self._paced(_responses_events(body, output, self.words, tokens))
            return StreamingResponse(stream, media_type="text/event-stream")
        return JSONResponse(_response(body, response_id(), output, tokens, len(self.words)))

    async def _paced(self, events: list[dict[str, Any] | str]) -> AsyncIterator[bytes]:
        done = False
        try:
            for event in events:
                if self.event_delay:
                    await asyncio.sleep(self.event_delay)
                yield _sse(event)
            done = True
        finally:
            if not done:
                with self._lock:
                    self.cancelled += 1


def _unknown_items(body: Mapping[str, Any]) -> Reply | None:
    """The 400 of an upstream that has no compaction for an input holding a compaction item
    (vLLM's Responses API validates `input` against the item types it knows)."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "compaction":
            message = f"input[{i}]: unknown input item type 'compaction'"
            error = {"message": message, "type": "invalid_request_error", "param": f"input[{i}]"}
            return Reply(400, body={"error": {**error, "code": None}})
    return None


def _sse(event: dict[str, Any] | str) -> bytes:
    if isinstance(event, str):
        return f"data: {event}\n\n".encode()
    name = event.get("type")
    data = json.dumps(event, separators=(",", ":"))
    if name and "choices" not in event:
        return f"event: {name}\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()


def _response(
    body: Mapping[str, Any], rid: str, output: list[dict[str, Any]], tokens: int, out: int
) -> dict[str, Any]:
    """A completed Responses `response` object."""
    usage = {
        "input_tokens": tokens,
        "input_tokens_details": {"cached_tokens": tokens // 2},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens + out,
    }
    return {
        "id": rid,
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "store": body.get("store", True),
        "usage": usage,
    }


def _responses_output(
    body: Mapping[str, Any], text: str, call: tuple[str, str] | None
) -> list[dict[str, Any]]:
    """The output items: a reasoning item when the request asks for reasoning (with its
    encrypted content when included), then a function call or a message."""
    out: list[dict[str, Any]] = []
    if body.get("reasoning") is not None:
        reasoning: dict[str, Any] = {"type": "reasoning", "id": "rs_fake", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            reasoning["encrypted_content"] = "gAAAAB" + "fakeEncrypted" * 8
        out.append(reasoning)
    if call is not None:
        name, arguments = call
        item = {"type": "function_call", "id": "fc_fake", "call_id": f"call_{len(text)}"}
        out.append({**item, "name": name, "arguments": arguments, "status": "completed"})
        return out
    part = {"type": "output_text", "text": text, "annotations": []}
    message = {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant"}
    out.append({**message, "content": [part]})
    return out


def response_id() -> str:
    """A new response's id, unique as OpenAI's are (`resp_` and 48 hex digits)."""
    return f"resp_{secrets.token_hex(24)}"


def _responses_events(
    body: Mapping[str, Any], output: list[dict[str, Any]], words: Sequence[str], tokens: int
) -> list[dict[str, Any] | str]:
    """The event stream of a Responses answer, as OpenAI sends it."""
    rid = response_id()
    start = {**_response(body, rid, [], 0, 0), "status": "in_progress", "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for k, item in enumerate(output):
        events += _item_events(item, k, words)
    done = _response(body, rid, output, tokens, len(words))
    events.append({"type": "response.completed", "response": done})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def _responses_failed(body: Mapping[str, Any], error: dict[str, Any]) -> list[dict[str, Any] | str]:
    """A stream that fails before any output: created, in progress, failed with `error`."""
    start = {**_response(body, response_id(), [], 0, 0), "status": "in_progress", "usage": None}
    failed = {
        **start,
        "status": "failed",
        "error": {"code": error["code"], "message": error["message"]},
    }
    events = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.failed", "response": failed},
    ]
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def _item_events(item: dict[str, Any], k: int, words: Sequence[str]) -> list[dict[str, Any]]:
    """The events of one output item: added, its deltas, done."""
    at = {"output_index": k}
    if item["type"] == "message":
        ids = {"item_id": item["id"], **at, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        events: list[dict[str, Any]] = [
            {"type": "response.output_item.added", **at, "item": {**item, "content": []}},
            {"type": "response.content_part.added", **ids, "part": empty},
        ]
        events += [
            {"type": "response.output_text.delta", **ids, "delta": w, "logprobs": []} for w in words
        ]
        text = "".join(words)
        events += [
            {"type": "response.output_text.done", **ids, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **ids, "part": item["content"][0]},
        ]
    elif item["type"] == "function_call":
        ids = {"item_id": item["id"], **at}
        added = {**item, "arguments": "", "status": "in_progress"}
        events = [
            {"type": "response.output_item.added", **at, "item": added},
            {"type": "response.function_call_arguments.delta", **ids, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **ids,
                "arguments": item["arguments"],
            },
        ]
    else:
        events = [{"type": "response.output_item.added", **at, "item": item}]
    return [*events, {"type": "response.output_item.done", **at, "item": item}]


def _error(protocol: str, reply: Reply, tokens: int) -> dict[str, Any]:
    kind = ERROR_TYPES.get(reply.status, "api_error")
    if protocol == "anthropic":
        text = f"prompt is too long: {tokens} tokens > {reply.limit} maximum"
        message = text if reply.overflow else "scripted failure"
        return {"type": "error", "error": {"type": kind, "message": message}}
    if reply.overflow:
        message = (
            f"This model's maximum context length is {reply.limit} tokens. However, your "
            f"messages resulted in {tokens} tokens. Please reduce the length of the messages."
        )
        param = "input" if protocol == "responses" else "messages"
        err = {"message": message, "type": kind, "param": param}
        return {"error": {**err, "code": "context_length_exceeded"}}
    return {"error": {"message": "scripted failure", "type": kind, "param": None, "code": None}}


def _openai_answer(body: Mapping[str, Any], text: str, tokens: int) -> dict[str, Any]:
    out = len(text) // 4
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": tokens, "completion_tokens": out, "total_tokens": tokens + out},
    }


def _openai_events(
    body: Mapping[str, Any], words: Sequence[str], tokens: int
) -> list[dict[str, Any] | str]:
    options = body.get("stream_options") or {}
    usage = options.get("include_usage") is True
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
    base["model"] = body.get("model")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**base, "choices": [choice], **({"usage": None} if usage else {})}

    events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": w}) for w in words]
    events.append(chunk({}, "stop"))
    if usage:
        out = len(words)
        total = {"prompt_tokens": tokens, "completion_tokens": out, "total_tokens": tokens + out}
        events.append({**base, "choices": [], "usage": total})
    events.append("[DONE]")
    return events


def _anthropic_answer(body: Mapping[str, Any], text: str, tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(tokens, len(text) // 4),
    }


def _anthropic_usage(tokens: int, out: int) -> dict[str, Any]:
    """`tokens` split as a cached prompt is: fresh input, cache reads and cache writes."""
    read, created = tokens // 2, tokens // 4
    return {
        "input_tokens": tokens - read - created,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
        "output_tokens": out,
    }


def _anthropic_events(
    body: Mapping[str, Any], words: Sequence[str], tokens: int
) -> list[dict[str, Any] | str]:
    message = {**_anthropic_answer(body, "", tokens), "content": [], "stop_reason": None}
    message["usage"] = _anthropic_usage(tokens, 1)
    events: list[dict[str, Any] | str] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
        for w in words
    ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": len(words)},
        },
        {"type": "message_stop"},
    ]
    return events


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake OpenAI + Anthropic provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901)
    parser.add_argument(
        "--no-compaction", action="store_true", help="no /v1/responses/compact (vLLM, Ollama)"
    )
    args = parser.parse_args(argv)
    fake = FakeProvider(record=False, compaction=not args.no_compaction)
    uvicorn.run(fake.app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
