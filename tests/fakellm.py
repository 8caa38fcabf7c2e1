"""A real HTTP fake of both provider protocols, for tests and benchmarks. Never a real model.

In tests::

    with FakeLLM() as fake:
        fake.script(Failure(429, headers={"retry-after-ms": "20"}), Failure(500))
        client = OpenAIClient(fake.base_url, None, ...)  # AnthropicClient works too
        ...
        assert len(fake.calls) == 3

As a process (benchmarks)::

    python -m tests.fakellm --port 8900 --delay 2.0 [--context-limit-chars 400000]

It serves `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic), and
`GET /_fake/stats`. Each request is answered, in order of precedence, by the next scripted
`Failure`, by a context-length error of its protocol when its prompt exceeds
`context_limit_chars`, or by `SUMMARY <sha1[:8]> of <N> chars` after `delay` seconds.
It runs on uvicorn (asyncio), so hundreds of slow requests can be in flight at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.proxy.dialects.anthropic import ERROR_TYPES

GATE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Failure:
    """One canned reply. `body` None: an error body of the request's protocol, or for a
    2xx status the normal answer, so `Failure(200, delay=5)` is one slow answer."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None  # a dict/list is sent as JSON, a str as is
    delay: float = 0.0
    echo_prompt: bool = False  # put the prompt in the error message (leak tests)


@dataclass(frozen=True)
class Call:
    """One request the fake received (and the status it answered)."""

    protocol: str
    path: str
    model: str | None
    max_tokens: int | None
    prompt: str
    chars: int
    sha1: str
    headers: Mapping[str, str]
    request: Mapping[str, Any]
    status: int
    at: float = 0.0  # time.time() when it arrived


def answer_for(prompt: str) -> str:
    """The fake's deterministic answer to a prompt."""
    digest = hashlib.sha1(prompt.encode()).hexdigest()
    return f"SUMMARY {digest[:8]} of {len(prompt)} chars"


def prompt_of(protocol: str, body: Mapping[str, Any]) -> str:
    """The request's text: system (Anthropic) and every message's text, one per line."""
    parts: list[str] = []
    system = body.get("system")
    if protocol == "anthropic" and system:
        parts.append(_text(system))
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            parts.append(_text(m.get("content")))
    return "\n".join(parts)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


class FakeLLM:
    """The fake provider on 127.0.0.1, in a background thread (a context manager)."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        context_limit_chars: int | None = None,
        gate: int | None = None,
        answer: Callable[[str], str] = answer_for,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.delay = delay
        self.context_limit_chars = context_limit_chars
        self.gate = gate  # hold requests until this many are in flight at once
        self.answer = answer
        self._defaults = (delay, context_limit_chars, gate, answer)
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._script: deque[Failure] = deque()
        self._calls: list[Call] = []
        self._in_flight = 0
        self.max_in_flight = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._handle, methods=["POST"]),
                Route("/v1/messages", self._handle, methods=["POST"]),
                Route("/_fake/stats", self._stats, methods=["GET"]),
            ]
        )

    @property
    def root_url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def base_url(self) -> str:
        """Works for both clients: OpenAI appends /chat/completions, Anthropic drops the /v1."""
        return f"{self.root_url}/v1"

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def script(self, *failures: Failure | int) -> None:
        """Queue failures for the next requests, in order (an int is a bare status)."""
        with self._lock:
            self._script.extend(f if isinstance(f, Failure) else Failure(f) for f in failures)

    def reset(self) -> None:
        """Forget calls and the script; restore the constructor's delay, limit, gate, answer."""
        with self._lock:
            self._script.clear()
            self._calls.clear()
            self.max_in_flight = self._in_flight
            self.delay, self.context_limit_chars, self.gate, self.answer = self._defaults

    def __enter__(self) -> FakeLLM:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        server, sock = self._make_server()
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fakellm", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fakellm did not start")
            time.sleep(0.005)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def serve_forever(self) -> None:
        """Run in the calling thread until interrupted (the `python -m` mode)."""
        server, sock = self._make_server()
        print(f"fakellm listening on {self.base_url}", flush=True)
        server.run(sockets=[sock])

    def _make_server(self) -> tuple[uvicorn.Server, socket.socket]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(4096)  # connections queue from now on, before uvicorn accepts them
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            backlog=4096,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=1,
        )
        return uvicorn.Server(config), sock

    async def _stats(self, request: Request) -> Response:
        with self._lock:
            stats = {
                "calls": len(self._calls),
                "in_flight": self._in_flight,
                "max_in_flight": self.max_in_flight,
            }
        return JSONResponse(stats)

    async def _handle(self, request: Request) -> Response:
        protocol = "anthropic" if request.url.path.endswith("/messages") else "openai"
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(_error(protocol, 400, "body is not JSON"), status_code=400)
        prompt = prompt_of(protocol, body)
        with self._lock:
            failure = self._script.popleft() if self._script else None
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            status, payload, headers, delay = self._reply(protocol, body, prompt, failure)
            self._record(protocol, request, body, prompt, status)
            await self._wait_for_gate()
            await asyncio.sleep(delay)
        finally:
            with self._lock:
                self._in_flight -= 1
        if isinstance(payload, str):
            return Response(payload, status_code=status, headers=dict(headers))
        return JSONResponse(payload, status_code=status, headers=dict(headers))

    def _reply(
        self, protocol: str, body: Mapping[str, Any], prompt: str, failure: Failure | None
    ) -> tuple[int, Any, Mapping[str, str], float]:
        """(status, payload, headers, delay) for one request."""
        if failure is not None:
            payload = failure.body
            if payload is None and failure.status < 300:  # a scripted slow answer
                payload = self._success(protocol, body, prompt)
            elif payload is None:
                message = (
                    f"scripted failure: {prompt}" if failure.echo_prompt else "scripted failure"
                )
                payload = _error(protocol, failure.status, message)
            return failure.status, payload, failure.headers, failure.delay
        limit = self.context_limit_chars
        if limit is not None and len(prompt) > limit:
            return 400, _context_error(protocol, len(prompt), limit), {}, 0.0
        return 200, self._success(protocol, body, prompt), {}, self.delay

    def _success(self, protocol: str, body: Mapping[str, Any], prompt: str) -> dict[str, Any]:
        text = self.answer(prompt)
        tokens_in, tokens_out = max(1, len(prompt) // 4), max(1, len(text) // 4)
        model = body.get("model")
        if protocol == "anthropic":
            return {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
            }
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            },
        }

    def _record(self, protocol: str, request: Request, body: Any, prompt: str, status: int) -> None:
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        call = Call(
            protocol=protocol,
            path=request.url.path,
            model=body.get("model"),
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            prompt=prompt,
            chars=len(prompt),
            sha1=hashlib.sha1(prompt.encode()).hexdigest(),
            headers=dict(request.headers),
            request=body,
            status=status,
            at=time.time(),
        )
        with self._lock:
            self._calls.append(call)

    async def _wait_for_gate(self) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while self.gate is not None and self.max_in_flight < self.gate:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)


def _error(protocol: str, status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _context_error(protocol: str, chars: int, limit: int) -> dict[str, Any]:
    tokens, maximum = chars // 4, limit // 4
    if protocol == "anthropic":
        message = f"prompt is too long: {tokens} tokens > {maximum} maximum"
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    message = (
        f"This model's maximum context length is {maximum} tokens. "
        f"However, your messages resulted in {tokens} tokens."
    )
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake LLM provider (OpenAI + Anthropic protocols)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--context-limit-chars", type=int, default=None)
    args = parser.parse_args(argv)
    fake = FakeLLM(
        delay=args.delay,
        context_limit_chars=args.context_limit_chars,
        host=args.host,
        port=args.port,
    )
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        fake.serve_forever()


if __name__ == "__main__":
    main()


__all__ = ["Call", "Failure", "FakeLLM", "answer_for", "prompt_of"]
