"""A strict, slow fake OpenAI + Anthropic + Gemini provider over real HTTP, for the proxy's
tests and benchmarks (the Gemini API: `FakeGemini`).

It serves `POST /v1/chat/completions`, `POST /v1/responses` and `POST /v1/messages` the way
the providers do (the stored-response endpoints of the Responses API answer plausibly),
records every request it receives (path, headers, JSON body, status, error message), and
answers each, in order of precedence, with: a refusal of a request that breaks one of the
providers' request rules below (400, the provider's own message); the next scripted
`Reply`; a context-length error of its protocol, with the provider's figures, when the
prompt (or the prompt plus the reply asked for) is over `limit_tokens`; else an answer whose
text is `words` joined, streamed event by event when the request says `stream: true`. Its
usage counts the prompt as prefit's heuristic counter does, times `scale`, so a test can
make prefit's estimates wrong by a known factor.

A fake is a claim about the real thing, so it takes the time real providers do (`Pace`:
seconds before the answer's headers, pauses inside a stream; small but nonzero in the proxy
tests, real seconds in a few) and refuses what they refuse (`strict`, on by default), with
their messages as users reported them (each rule below names where):

Anthropic Messages (`anthropic_refusal`):
- every `tool_use` of an assistant message is answered by a `tool_result` in the next (user)
  message: "messages.N: `tool_use` ids were found without `tool_result` blocks immediately
  after: ID. Each `tool_use` block must have a corresponding `tool_result` block in the next
  message." (anthropics/claude-code#1237, #5989; OpenHands/OpenHands#7512, where a trimmed
  prompt split a pair);
- every `tool_result` answers a `tool_use` of the message before it: "messages.N.content.K:
  unexpected `tool_use_id` found in `tool_result` blocks: ID. Each `tool_result` block must
  have a corresponding `tool_use` block in the previous message." (anthropics/claude-code#13460,
  router-for-me/CLIProxyAPI#497);
- with `thinking` enabled, in a running tool loop (the last message carries tool results)
  the turn's first assistant message must start with a thinking block: "messages.N.content.0.type:
  Expected `thinking` or `redacted_thinking`, but found `text`. When `thinking` is enabled, a
  final `assistant` message must start with a thinking block (preceeding the lastmost set of
  `tool_use` and `tool_result` blocks). ..." (n8n-io/n8n#22550, anthropics/claude-code#20705,
  OpenRouterTeam/ai-sdk-provider#162); and an assistant message holding thinking blocks starts
  with one: "messages.N.content.0: If an assistant message contains any thinking blocks, the
  first block must be thinking or redacted_thinking. Found text." (anthropics/claude-code#20705);
- at most 4 blocks carry `cache_control` (system, tools and messages together): "A maximum of 4
  blocks with cache_control may be provided. Found 5." (tghamm/Anthropic.SDK#50,
  Wei-Shaw/sub2api#176);
- text blocks are not empty: "messages: text content blocks must be non-empty"
  (stackblitz/bolt.new#7426), nor only whitespace: "messages: text content blocks must
  contain non-whitespace text" (anomalyco/opencode#3194); a message's content is not empty:
  "messages.N: all messages must have non-empty content except for the optional final
  assistant message";
- the prompt fits the window, and so does the prompt plus `max_tokens`: "prompt is too long:
  N tokens > W maximum"; "input length and `max_tokens` exceed context limit: N + M > W,
  decrease input length or `max_tokens` and try again" (anthropics/claude-code#228,
  docker/docker-agent#569, continuedev/continue#6080).

OpenAI Chat Completions (`chat_refusal`):
- an assistant message's `tool_calls` are each answered by a `tool` message after it: "An
  assistant message with 'tool_calls' must be followed by tool messages responding to each
  'tool_call_id'. The following tool_call_ids did not have response messages: ID"
  (BerriAI/litellm#10083, router-for-me/CLIProxyAPI#2798, param `messages.[N].role`);
- a `tool` message answers a call of the assistant message before it: "Invalid parameter:
  messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
  (smarter-sh/smarter#264, miurla/morphic#136);
- the prompt plus `max_completion_tokens` (or `max_tokens`) fits the window: "This model's
  maximum context length is W tokens. However, you requested T tokens (N in the messages, M
  in the completion). ...", code `context_length_exceeded` (dimagi/open-chat-studio#463;
  openai/openai-python's `BadRequestError`).

OpenAI Responses (`responses_refusal`, unless the request continues `previous_response_id`):
- a `reasoning` item is followed by the item it belongs to: "Item 'rs_...' of type
  'reasoning' was provided without its required following item." (openai/openai-node#1567,
  vercel/ai#7099, continuedev/continue#8933);
- a `function_call_output` answers a `function_call` before it: "No tool call found for
  function call output with call_id ID." (continuedev/continue#10092), and a `function_call`
  is answered: "No tool output found for function call ID." (tjardoo/openai-client#124);
- the prompt plus `max_output_tokens` fits the window, as Chat Completions.

As a process (the benchmarks):

    python -m tests.fakeprovider --port 8901 [--headers-s 0.5 --events-s 0.02]
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
from typing import Any, Protocol

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
    error: str = ""  # the message of the error it answered with, if any


class Counts(Protocol):
    """What the fake counts a prompt with (prefit's heuristic, or a real tokenizer)."""

    def count(self, messages: list[Any], tools: list[Any]) -> float:
        """The prompt's tokens."""
        ...


def prompt_tokens(
    protocol: str, body: Mapping[str, Any], scale: float = 1.0, counter: Counts | None = None
) -> int:
    """The fake's count of a request's prompt: prefit's heuristic count (or `counter`'s),
    times `scale`."""
    messages = body.get("messages") or []
    try:
        if protocol == "anthropic":
            messages = from_anthropic(body.get("system"), messages)
        elif protocol == "responses":
            messages = from_responses(body.get("instructions"), body.get("input"))
        counted = (counter or _COUNTER).count(messages, body.get("tools") or [])
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
        strict: bool = True,
        counter: Counts | None = None,
    ) -> None:
        self.limit_tokens = limit_tokens
        self.scale = scale
        self.words = tuple(words)
        self.pace = pace
        self.record = record
        # False: an upstream without OpenAI's compaction (vLLM, Ollama, a gateway): no
        # /v1/responses/compact route (a plain 404) and a `compaction` input item refused
        self.compaction = compaction
        self.strict = strict  # refuse what the providers refuse (the module docstring)
        self.counter = counter  # None: prefit's heuristic, so tests know its count exactly
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
        refused = self._refusal(protocol, body, None)
        if refused is not None:
            self._note(protocol, request, body, 400, _message(refused))
            return JSONResponse(refused, status_code=400)
        with self._lock:
            reply = self._script.pop(0) if self._script else None
        self._note(protocol, request, body, reply.status if reply is not None else 200)
        if not await self._think(request):
            return Response(status_code=499)
        if reply is not None and reply.status >= 300:
            payload = _error(protocol, reply, 0, 0)
            return JSONResponse(payload, status_code=reply.status, headers=dict(reply.headers))
        counted = {"input_tokens": prompt_tokens(protocol, body, self.scale, self.counter)}
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

    def _note(
        self, protocol: str, request: Request, body: dict[str, Any], status: int, error: str = ""
    ) -> None:
        if self.record:
            with self._lock:
                self._received.append(
                    Received(protocol, dict(request.headers), body, status, request.url.path, error)
                )

    def _refusal(
        self, protocol: str, body: Mapping[str, Any], limit: int | None
    ) -> dict[str, Any] | None:
        """The provider's refusal of `body` by its rules (and, with `limit`, its window)."""
        if not self.strict:
            return None
        if protocol == "anthropic":
            return anthropic_refusal(body, limit, self.scale)
        if protocol == "openai":
            return chat_refusal(body, limit, self.scale)
        return responses_refusal(body, limit, self.scale)

    async def _handle(self, protocol: str, request: Request) -> Response:
        body = json.loads(await request.body())
        tokens = prompt_tokens(protocol, body, self.scale, self.counter)
        refused = self._refusal(protocol, body, None)
        if refused is not None:  # a provider checks a request's shape first, and at once
            self._note(protocol, request, body, 400, _message(refused))
            return JSONResponse(refused, status_code=400)
        with self._lock:
            reply = self._script.pop(0) if self._script else None
        over = self.limit_tokens is not None and tokens + _asked(body) > self.limit_tokens
        if reply is None and over:
            reply = Reply(400, overflow=True, limit=self.limit_tokens or 0)
        if reply is None and protocol == "responses" and not self.compaction:
            reply = _unknown_items(body)
        status, error = 200, ""
        if reply is not None and reply.status >= 300:
            status = reply.status
            shown = reply.body or _error(protocol, reply, tokens, _asked(body))
            error = _message(shown)
        elif reply is not None:
            status = reply.status
        self._note(protocol, request, body, status, error)
        if not await self._think(request):
            return Response(status_code=499)  # nobody is listening any more
        in_stream = protocol == "responses" and body.get("stream") is True
        if self.overflow_in_stream and in_stream and reply is not None and reply.overflow:
            failed = _responses_failed(body, _error(protocol, reply, tokens, _asked(body))["error"])
            return StreamingResponse(self._paced(failed), media_type="text/event-stream")
        if reply is not None and reply.status >= 300:
            payload = (
                dict(reply.body)
                if reply.body is not None
                else _error(protocol, reply, tokens, _asked(body))
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


def _error(protocol: str, reply: Reply, tokens: int, asked: int) -> dict[str, Any]:
    """The error body of `reply` (an overflow states its figures as the provider does: the
    prompt alone over the window, or the prompt plus the reply `asked` for)."""
    if protocol == "anthropic":
        kind = ERROR_TYPES.get(reply.status, "api_error")
        message = "scripted failure"
        if reply.overflow:
            message = anthropic_overflow(tokens, asked, reply.limit)
        return {"type": "error", "error": {"type": kind, "message": message}}
    if reply.overflow:
        return _openai_error(openai_overflow(tokens, asked, reply.limit), _param(protocol))
    kind = ERROR_TYPES.get(reply.status, "api_error")
    return {"error": {"message": "scripted failure", "type": kind, "param": None, "code": None}}


def anthropic_overflow(tokens: int, asked: int, limit: int) -> str:
    """Anthropic's message for a prompt of `tokens` (asking `asked` more) over `limit`."""
    if tokens > limit or not asked:
        return f"prompt is too long: {tokens} tokens > {limit} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {tokens} + {asked} > {limit}, "
        "decrease input length or `max_tokens` and try again"
    )


def openai_overflow(tokens: int, asked: int, limit: int) -> str:
    """OpenAI's message for a prompt of `tokens` (asking `asked` more) over `limit`."""
    if not asked:
        return (
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages."
        )
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{tokens + asked} tokens ({tokens} in the messages, {asked} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def _openai_error(message: str, param: str | None, code: str | None = None) -> dict[str, Any]:
    code = code if code is not None else "context_length_exceeded"
    err = {"message": message, "type": "invalid_request_error", "param": param}
    return {"error": {**err, "code": code or None}}


def _param(protocol: str) -> str:
    return "input" if protocol == "responses" else "messages"


def _message(error: Mapping[str, Any]) -> str:
    inner = error.get("error")
    return str(inner.get("message", "")) if isinstance(inner, dict) else ""


def _asked(body: Mapping[str, Any]) -> int:
    """The reply a request asks for (0 when none), as each provider reads it."""
    for name in ("max_completion_tokens", "max_output_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


# --- the providers' request rules (the module docstring cites each) -----------------------

THINKING_DOC = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
MAX_CACHE_BREAKPOINTS = 4


def _blocks(content: Any) -> list[dict[str, Any]]:
    """An Anthropic message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _anthropic_error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def anthropic_refusal(
    body: Mapping[str, Any], limit: int | None = None, scale: float = 1.0
) -> dict[str, Any] | None:
    """Anthropic's 400 for `body` when it breaks one of its request rules; None if none."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    message = (
        _anthropic_content(body, messages)
        or _anthropic_pairs(messages)
        or _anthropic_thinking(body, messages)
    )
    if message is None and limit is not None:
        tokens = prompt_tokens("anthropic", body, scale)
        if tokens + _asked(body) > limit:
            message = anthropic_overflow(tokens, _asked(body), limit)
    return _anthropic_error(message) if message is not None else None


def _anthropic_content(body: Mapping[str, Any], messages: list[Any]) -> str | None:
    """Empty messages and text blocks, and more than 4 cache breakpoints."""
    marked = 0
    system = body.get("system")
    for block in _blocks(system) if isinstance(system, list) else []:
        marked += "cache_control" in block
        if block.get("type") == "text" and not str(block.get("text", "")):
            return "system: text content blocks must be non-empty"
    for tool in body.get("tools") or []:
        marked += isinstance(tool, dict) and "cache_control" in tool
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        last_assistant = i == len(messages) - 1 and msg.get("role") == "assistant"
        if content in ("", []) and not last_assistant:
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for block in _blocks(content) if isinstance(content, list) else []:
            marked += "cache_control" in block
            if block.get("type") != "text":
                continue
            text = str(block.get("text", ""))
            if not text:
                return "messages: text content blocks must be non-empty"
            if not text.strip():
                return "messages: text content blocks must contain non-whitespace text"
    if marked > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {marked}."
    return None


def _uses(msg: Any) -> list[str]:
    """The ids of an assistant message's `tool_use` blocks."""
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return []
    return [str(b.get("id")) for b in _blocks(msg.get("content")) if b.get("type") == "tool_use"]


def _results(msg: Any) -> list[tuple[int, str]]:
    """(block index, tool_use_id) of a user message's `tool_result` blocks."""
    if not isinstance(msg, dict) or msg.get("role") != "user":
        return []
    blocks = _blocks(msg.get("content"))
    return [
        (k, str(b.get("tool_use_id")))
        for k, b in enumerate(blocks)
        if b.get("type") == "tool_result"
    ]


def _anthropic_pairs(messages: list[Any]) -> str | None:
    """Each tool_use answered in the next message, each tool_result answering the last one."""
    for i, msg in enumerate(messages):
        before = set(_uses(messages[i - 1])) if i else set()
        for k, use_id in _results(msg):
            if use_id not in before:
                return (
                    f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {use_id}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )
        uses = _uses(msg)
        answered = {u for _, u in _results(messages[i + 1])} if i + 1 < len(messages) else set()
        missing = [u for u in uses if u not in answered]
        if missing:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
    return None


def _anthropic_thinking(body: Mapping[str, Any], messages: list[Any]) -> str | None:
    """With thinking on, a running tool loop's first assistant message starts with thinking."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    first_kinds = ("thinking", "redacted_thinking")
    for i, msg in enumerate(messages):
        blocks = _blocks(msg.get("content")) if isinstance(msg, dict) else []
        if msg.get("role") != "assistant" or not blocks:
            continue
        if (
            any(b.get("type") in first_kinds for b in blocks)
            and blocks[0].get("type") not in first_kinds
        ):
            return (
                f"messages.{i}.content.0: If an assistant message contains any thinking "
                "blocks, the first block must be thinking or redacted_thinking. Found "
                f"{blocks[0].get('type')}."
            )
    if not messages or not _only_results(messages[-1]):
        return None  # no tool loop running: earlier turns' thinking may be left out
    start = max((i for i, m in enumerate(messages) if _a_request(m)), default=-1)
    turn = [i for i in range(start + 1, len(messages)) if messages[i].get("role") == "assistant"]
    if not turn:
        return None
    blocks = _blocks(messages[turn[0]].get("content"))
    found = blocks[0].get("type") if blocks else "text"
    if found in first_kinds:
        return None
    return (
        f"messages.{turn[0]}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
        f"found `{found}`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
        "blocks). We recommend you include thinking blocks from previous turns. To avoid "
        f"this requirement, disable `thinking`. Please consult our documentation at {THINKING_DOC}"
    )


def _only_results(msg: Any) -> bool:
    """Whether `msg` is a user message of tool results only (a step of a tool loop)."""
    if not isinstance(msg, dict) or msg.get("role") != "user":
        return False
    blocks = _blocks(msg.get("content"))
    return bool(blocks) and all(b.get("type") == "tool_result" for b in blocks)


def _a_request(msg: Any) -> bool:
    """Whether `msg` opens a turn: a user message that is not only tool results."""
    return isinstance(msg, dict) and msg.get("role") == "user" and not _only_results(msg)


def chat_refusal(
    body: Mapping[str, Any], limit: int | None = None, scale: float = 1.0
) -> dict[str, Any] | None:
    """OpenAI Chat Completions' 400 for `body` when it breaks a request rule; None if none."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    calls: list[str] = []  # the calls of the assistant message the tool messages follow
    opened_at = -1
    for i, msg in enumerate([*messages, {"role": "end"}]):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role == "tool":
            call_id = str(msg.get("tool_call_id"))
            if call_id not in calls:
                message = (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'."
                )
                return _openai_error(message, f"messages.[{i}].role", "")
            calls.remove(call_id)
            continue
        if calls:
            message = (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(calls)}"
            )
            return _openai_error(message, f"messages.[{opened_at}].role", "")
        calls = []
        if role == "assistant":
            opened_at = i
            calls = [str(c.get("id")) for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
    if limit is not None:
        tokens = prompt_tokens("openai", body, scale)
        if tokens + _asked(body) > limit:
            return _openai_error(openai_overflow(tokens, _asked(body), limit), "messages")
    return None


def responses_refusal(
    body: Mapping[str, Any], limit: int | None = None, scale: float = 1.0
) -> dict[str, Any] | None:
    """The Responses API's 400 for `body` when it breaks a request rule; None if none."""
    items = body.get("input")
    if not isinstance(items, list) or body.get("previous_response_id"):
        return None
    items = [i for i in items if isinstance(i, dict)]
    message = _responses_items(items)
    if message is None and limit is not None:
        tokens = prompt_tokens("responses", body, scale)
        if tokens + _asked(body) > limit:
            return _openai_error(openai_overflow(tokens, _asked(body), limit), "input")
    return _openai_error(message, "input", "") if message is not None else None


def _responses_items(items: list[dict[str, Any]]) -> str | None:
    calls: set[str] = set()
    outputs = {str(i.get("call_id")) for i in items if i.get("type") == "function_call_output"}
    for k, item in enumerate(items):
        kind = item.get("type")
        if kind == "reasoning":
            after = items[k + 1] if k + 1 < len(items) else None
            if after is None or not _follows_reasoning(after):
                return (
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
        elif kind == "function_call":
            calls.add(str(item.get("call_id")))
            if str(item.get("call_id")) not in outputs:
                return f"No tool output found for function call {item.get('call_id')}."
        elif kind == "function_call_output" and str(item.get("call_id")) not in calls:
            return (
                f"No tool call found for function call output with call_id {item.get('call_id')}."
            )
    return None


def _follows_reasoning(item: Mapping[str, Any]) -> bool:
    """Whether `item` may follow a reasoning item: the output item it was reasoning for."""
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return kind not in ("reasoning", "function_call_output", "item_reference")


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
            return missing_signature(fn[0]["functionCall"].get("name"), n)
    return None


def missing_signature(name: Any, n: int) -> str:
    """Gemini 3's refusal of content `n`'s function call `name` sent without its signature."""
    return (
        "Function call is missing a thought_signature in functionCall parts. This is "
        "required for tools to work correctly, and missing thought_signature may lead "
        f"to degraded model performance. Additional data, function call "
        f"`default_api:{name}` , position {n + 1}. Please refer to "
        "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
    )


def _gemini_prompt(content: Any) -> bool:
    """Whether `content` is the person's (a user content with text, no function response)."""
    parts = content.get("parts") if isinstance(content, dict) else None
    return (
        isinstance(parts, list)
        and content.get("role", "user") == "user"
        and any(isinstance(p, dict) and "text" in p for p in parts)
        and not any(isinstance(p, dict) and "functionResponse" in p for p in parts)
    )


def gemini_overflow(tokens: int, limit: int) -> str:
    """Gemini's overflow message (google-gemini/gemini-cli#4118, #6678)."""
    return (
        f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({limit})."
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
        if reply is not None and reply.overflow:
            return 400, gemini_overflow(tokens, reply.limit)
        if reply is not None and reply.status >= 300:
            return reply.status, "scripted failure"
        inner = body.get("generateContentRequest")
        fault = gemini_fault(model, (inner if isinstance(inner, dict) else body).get("contents"))
        if fault is not None:
            return 400, fault
        limit = self.fake.limit_tokens
        if limit is not None and tokens > limit and verb != "countTokens":
            return 400, gemini_overflow(tokens, limit)
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
