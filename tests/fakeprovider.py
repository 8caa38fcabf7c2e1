"""A fake OpenAI + Anthropic + Gemini provider over real HTTP, for the proxy's tests and
benchmark (the Gemini API: `FakeGemini`).

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
import base64
import hashlib
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
from shared.formats.gemini import from_gemini, gemini_tools
from shared.formats.responses import from_responses

WORDS = tuple(f"word{i} " for i in range(12))
_COUNTER = HeuristicCounter()


@dataclass(frozen=True)
class Pace:
    """How long the fake takes, as a provider does: `headers` seconds before an answer's
    headers (a whole unstreamed answer, or a stream's first event: the time to the first
    token), then `events` seconds before each further event of a stream, or `pauses[n]`
    before event n (a long pause mid-stream: a tool call being written, a thinking block)."""

    headers: float = 0.0
    events: float = 0.0
    pauses: Mapping[int, float] = field(default_factory=dict)

    def before(self, n: int) -> float:
        """The pause before event `n` of a stream (the first, 0, waits `headers` instead)."""
        return self.pauses.get(n, self.events) if n else 0.0


AT_ONCE = Pace()
# the proxy tests' default: small but nonzero, so every test goes through a provider that
# takes time (a few tests use real multi-second paces), and the suite stays fast
QUICK = Pace(headers=0.03, events=0.003)


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
        pace: Pace = QUICK,
        record: bool = True,
        compaction: bool = True,
    ) -> None:
        self.limit_tokens = limit_tokens
        self.scale = scale
        self.words = tuple(words)
        self.pace = pace
        self.record = record
        # False: an upstream without OpenAI's compaction (vLLM, Ollama, a gateway): no
        # /v1/responses/compact route (a plain 404) and a `compaction` input item refused
        self.compaction = compaction
        # a streamed Responses request over the window is refused inside a 200 stream, by a
        # `response.failed` event (recorded as a 400), as OpenAI may do
        self.overflow_in_stream = False
        self.cancelled = 0  # answers whose client went away before the end
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
                Route("/v1beta/models/{target}", self._gemini, methods=["POST"]),
                Route("/v1/models/{target}", self._gemini, methods=["POST"]),
            ]
        )
        self.gemini = FakeGemini(self)

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
        if not await self._think(request):
            return Response(status_code=499)
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
        if not await self._think(request):
            return Response(status_code=499)  # nobody is listening any more
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

    async def _gemini(self, request: Request) -> Response:
        return await self.gemini.handle(request)

    async def _think(self, request: Request) -> bool:
        """Wait `pace.headers` before answering, as a provider computes; False (counted in
        `cancelled`) when the client goes away meanwhile: its request body is read, so the
        next thing the server hears from it is its disconnect."""
        wait = self.pace.headers
        if wait <= 0:
            return True
        try:
            async with asyncio.timeout(wait):
                while (await request.receive())["type"] != "http.disconnect":
                    pass
        except TimeoutError:
            return True
        with self._lock:
            self.cancelled += 1
        return False

    async def _paced(self, events: list[dict[str, Any] | str]) -> AsyncIterator[bytes]:
        done = False
        try:
            for n, event in enumerate(events):
                wait = self.pace.before(n)
                if wait:
                    await asyncio.sleep(wait)
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
        reasoning: dict[str, Any] = {
            "type": "reasoning",
            "id": f"rs_{secrets.token_hex(24)}",
            "summary": [],
        }
        if "reasoning.encrypted_content" in (body.get("include") or []):
            reasoning["encrypted_content"] = "gAAAAB" + "fakeEncrypted" * 8
        out.append(reasoning)
    if call is not None:
        name, arguments = call
        item = {
            "type": "function_call",
            "id": f"fc_{secrets.token_hex(24)}",
            "call_id": f"call_{len(text)}",
        }
        out.append({**item, "name": name, "arguments": arguments, "status": "completed"})
        return out
    part = {"type": "output_text", "text": text, "annotations": []}
    message = {
        "type": "message",
        "id": f"msg_{secrets.token_hex(24)}",
        "status": "completed",
        "role": "assistant",
    }
    out.append({**message, "content": [part]})
    return out


def response_id() -> str:
    """A new response's id, unique as OpenAI's are (`resp_` and 48 hex digits; its items'
    ids too: `msg_`, `fc_`, `rs_`)."""
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
        "id": f"msg_{secrets.token_hex(24)}",
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


# --- the Gemini API ---------------------------------------------------------------------------

GEMINI_KEY_MISSING = (  # what the Gemini API answers a call without a key (403)
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
RESPONSE_COUNT = (  # a function call turn answered by fewer or more responses (400)
    "Please ensure that the number of function response parts is equal to the number of "
    "function call parts of the function call turn."
)


_SIGNED = b"fake-gemini-signature:"
ORPHAN_RESPONSE = (
    "Please ensure that function response turn comes immediately after a function call turn."
)


def gemini_signature(call: Mapping[str, Any]) -> str:
    """The thought signature the fake issues for a function call: a digest of it, so a
    signature that comes back on another call, or altered, is seen."""
    digest = hashlib.sha256(json.dumps(call, sort_keys=True).encode()).digest()
    # bytes in the SDK's types, which write them URL-safe: the same text comes back
    return base64.urlsafe_b64encode(_SIGNED + digest).decode()


def _forged(signature: Any, call: Mapping[str, Any]) -> bool:
    """Whether `signature` is one the fake issued, but not for `call` (moved or altered)."""
    try:
        raw = base64.urlsafe_b64decode(signature) if isinstance(signature, str) else b""
    except ValueError:
        return False
    return raw.startswith(_SIGNED) and signature != gemini_signature(call)


def gemini_tokens(body: Mapping[str, Any], scale: float = 1.0) -> int:
    """The fake's count of a Gemini request's prompt: prefit's heuristic count, times `scale`."""
    inner = body.get("generateContentRequest")
    request = inner if isinstance(inner, dict) else body
    try:
        messages = from_gemini(request.get("systemInstruction"), request.get("contents"))
        counted = _COUNTER.count(messages, gemini_tools(request.get("tools")))
    except InvalidTranscript:
        counted = len(json.dumps(body)) // 4
    return math.ceil(counted * scale)


def gemini_fault(model: str, contents: Any) -> str | None:
    """Why the Gemini API refuses `contents` with a 400 INVALID_ARGUMENT, if it does: not a
    list of contents with parts; a function call turn answered by a different number of
    responses; on Gemini 3, a turn of the current step whose first function call lost its
    thought signature ("Function call is missing a thought_signature in functionCall parts",
    as in ai.google.dev/gemini-api/docs/thought-signatures and the reports of it, e.g.
    chatboxai/chatbox#3308, csells/dartantic#86), or a signature the fake never issued for
    that call."""
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    calls = 0
    for n, content in enumerate(contents):
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list) or not parts:
            return (
                f"* GenerateContentRequest.contents[{n}].parts: contents.parts must not be empty."
            )
        answered = sum(1 for p in parts if isinstance(p, dict) and "functionResponse" in p)
        if calls and answered != calls:
            return RESPONSE_COUNT
        if answered and not calls:
            return ORPHAN_RESPONSE
        fn = [p for p in parts if isinstance(p, dict) and "functionCall" in p]
        calls = len(fn) if content.get("role") == "model" else 0
        for p in fn:
            if _forged(p.get("thoughtSignature"), p["functionCall"]):
                return "Corrupted thought signature."
    if not model.startswith("gemini-3"):
        return None
    step = max((n for n, c in enumerate(contents) if _gemini_prompt(c)), default=0)
    for n, content in enumerate(contents[step:], start=step):
        fn = [p for p in content.get("parts", []) if "functionCall" in p]
        if fn and "thoughtSignature" not in fn[0]:
            name = fn[0]["functionCall"].get("name")
            return (
                "Function call is missing a thought_signature in functionCall parts. This is "
                "required for tools to work correctly, and missing thought_signature may lead "
                f"to degraded model performance. Additional data, function call "
                f"`default_api:{name}` , position {n + 1}. Please refer to "
                "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
            )
    return None


def _gemini_prompt(content: Any) -> bool:
    """Whether `content` is the person's (a user content with text, no function response)."""
    parts = content.get("parts") if isinstance(content, dict) else None
    return (
        isinstance(parts, list)
        and content.get("role", "user") == "user"
        and any(isinstance(p, dict) and "text" in p for p in parts)
        and not any(isinstance(p, dict) and "functionResponse" in p for p in parts)
    )


def gemini_error(status: int, message: str) -> dict[str, Any]:
    kinds = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED"}
    return {"error": {"code": status, "message": message, "status": kinds.get(status, "INTERNAL")}}


class FakeGemini:
    """The Gemini API of the fake: `models/{model}:generateContent`,
    `:streamGenerateContent?alt=sse` (SSE `data:` chunks, `usageMetadata` on each, the last
    with `finishReason`) and `:countTokens`, as google-genai's SDK reads them
    (google/genai/models.py, _api_client.py). It refuses a call without a key (403), contents
    the API refuses (`gemini_fault`, 400), a prompt over `limit_tokens` (400: "The input
    token count (N) exceeds the maximum number of tokens allowed (M).", as
    google-gemini/gemini-cli#4118 and #6678 show it); a scripted `Reply` with `call` answers
    with a function call carrying a thought signature (`gemini_signature`), after a thought.
    It takes the fake's `pace`, as the other protocols do."""

    def __init__(self, fake: FakeProvider) -> None:
        self.fake = fake

    async def handle(self, request: Request) -> Response:
        model, _, verb = str(request.path_params["target"]).partition(":")
        body = json.loads(await request.body())
        fake = self.fake
        with fake._lock:
            reply = fake._script.pop(0) if fake._script else None
        tokens = gemini_tokens(body, fake.scale)
        if not await fake._think(request):  # the client went away while it "computed"
            return Response(status_code=499)
        error = self._refused(request, model, verb, body, tokens, reply)
        fake._note("gemini", request, body, error[0] if error else 200)
        if error is not None:
            return JSONResponse(gemini_error(*error), status_code=error[0])
        if verb == "countTokens":
            return JSONResponse({"totalTokens": tokens})
        parts = self._parts(reply)
        if verb == "streamGenerateContent":
            chunks = self._chunks(model, parts, tokens)
            return StreamingResponse(self._sent(chunks), media_type="text/event-stream")
        return JSONResponse(self._answer(model, parts, tokens, tokens, final=True))

    def _refused(
        self,
        request: Request,
        model: str,
        verb: str,
        body: dict[str, Any],
        tokens: int,
        reply: Reply | None,
    ) -> tuple[int, str] | None:
        if not (request.headers.get("x-goog-api-key") or request.query_params.get("key")):
            return 403, GEMINI_KEY_MISSING
        if verb not in ("generateContent", "streamGenerateContent", "countTokens"):
            return 404, f"Method not found: {verb}"
        if reply is not None and reply.status >= 300:
            return reply.status, "scripted failure"
        inner = body.get("generateContentRequest")
        fault = gemini_fault(model, (inner if isinstance(inner, dict) else body).get("contents"))
        if fault is not None:
            return 400, fault
        limit = self.fake.limit_tokens
        if limit is not None and tokens > limit and verb != "countTokens":
            return 400, (
                f"The input token count ({tokens}) exceeds the maximum number of tokens "
                f"allowed ({limit})."
            )
        return None

    def _parts(self, reply: Reply | None) -> list[dict[str, Any]]:
        if reply is not None and reply.call is not None:
            name, args = reply.call
            call = {"name": name, "args": json.loads(args)}
            thought = {"text": f"I should call {name}.", "thought": True}
            return [thought, {"functionCall": call, "thoughtSignature": gemini_signature(call)}]
        return [{"text": "".join(self.fake.words)}]

    def _answer(
        self, model: str, parts: list[dict[str, Any]], tokens: int, out: int, *, final: bool
    ) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if final:
            candidate["finishReason"] = "STOP"
        usage = {"promptTokenCount": tokens, "totalTokenCount": tokens + out}
        if final:
            usage["candidatesTokenCount"] = out
        return {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": "fake-gemini",
        }

    def _chunks(self, model: str, parts: list[dict[str, Any]], tokens: int) -> list[str]:
        if len(parts) != 1 or "text" not in parts[0]:
            pieces = [[p] for p in parts]
        else:
            pieces = [[{"text": w}] for w in self.fake.words]
        return [
            json.dumps(self._answer(model, p, tokens, k + 1, final=k == len(pieces) - 1))
            for k, p in enumerate(pieces)
        ]

    async def _sent(self, chunks: list[str]) -> AsyncIterator[bytes]:
        for n, chunk in enumerate(chunks):  # as Google's front end frames them
            wait = self.fake.pace.before(n)
            if wait:
                await asyncio.sleep(wait)
            yield f"data: {chunk}\r\n\r\n".encode()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake OpenAI + Anthropic provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901)
    parser.add_argument("--headers-s", type=float, default=0.0, help="seconds before headers")
    parser.add_argument("--events-s", type=float, default=0.0, help="seconds between events")
    parser.add_argument(
        "--no-compaction", action="store_true", help="no /v1/responses/compact (vLLM, Ollama)"
    )
    args = parser.parse_args(argv)
    pace = Pace(args.headers_s, args.events_s)
    fake = FakeProvider(record=False, pace=pace, compaction=not args.no_compaction)
    uvicorn.run(fake.app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
