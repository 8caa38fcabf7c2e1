"""A scripted fake LLM provider ("brain") that drives real agent CLIs through long sessions.

    uv run python -m bench.agents.brain --port 9100 --log brain.jsonl [--window 100000]
        [--turns 40] [--output-kb 24] [--output-style hex|text]

Speaks OpenAI Chat Completions (`POST /v1/chat/completions`), the OpenAI Responses API
(`POST /v1/responses`), Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`)
and the Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`), streamed (SSE events as each provider sends them) and not, plus
`GET /v1/models`. Gemini's prompt is refused over the window with its own 400
(`The input token count (N) exceeds the maximum number of tokens allowed (M).`); every
function call it makes carries a thought signature, and a request whose current step lost
one, or carries one it never issued, or whose function responses do not pair with their
call turn, is refused as Gemini 3 refuses it (`gemini_signature_error`).

The window: a request whose prompt plus the reply it allows (`max_tokens`,
`max_completion_tokens`, `max_output_tokens`) exceeds `--window` is refused with that
provider's own context-length error (OpenAI 400 `context_length_exceeded`; Anthropic 400
`prompt is too long: N tokens > M maximum` or `input length and max_tokens exceed context
limit: a + b > c`). The prompt is counted with tiktoken o200k_base (loaded from
`--tiktoken-dir`, default /work/shared/tiktoken): every string value of the
transcript (text, tool arguments, tool outputs; not ids, roles or types) plus 4 per
message/item, plus the `tools` array as JSON. That count is also the `usage` reported.

The script, stateless so it survives any cut of the transcript: the task a driver gives
contains `TASK-MARKER-<sid>`; the shell command of turn n prints `AGENTRUN sid=<sid> turn=<n>`
then `--output-kb` of hash lines. On a request that offers a shell tool (Claude Code's
`Bash`, Codex's `shell`/`shell_command`/`exec_command`/`local_shell`, opencode's `bash`) the
brain reads the highest turn of its session still in the prompt (the latest tool call is
always among the recent turns) and calls the tool for the next one, with the argument
schema the request's `tools` declare; after `--turns` it answers a final text. A request
without a shell tool is answered in text: a summary (repeating the task sentence, as a
competent summarizer would) when it asks for one, an aider SEARCH/REPLACE edit every fifth
aider turn, else a short answer.

Every request is appended to `--log` as one JSON line: time, api, session, turn, kind
(`main`: the agent loop; `side`: titles, summaries, checks), prompt tokens, the reply
allowance, overflowed, whether the session's task marker is in the prompt, status.
Loopback only; asserts nothing.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from shared.counting.encodings import load_encoding
from tests.fakeprovider import missing_signature

MARKER = re.compile(r"TASK-MARKER-([0-9a-z]+)")
TURN = re.compile(r"AGENTRUN sid=([0-9a-z]+) turn=(\d+)")
SHELL_TOOLS = (
    "Bash", "bash", "shell", "shell_command", "exec_command", "local_shell", "run_shell_command",
)  # fmt: skip
SKIP_KEYS = frozenset(
    {"type", "role", "id", "call_id", "tool_call_id", "tool_use_id", "status", "signature"}
)
THINKING = ("thinking", "redacted_thinking")
# an instruction to summarize (Claude Code's, Codex's compaction prompts), not a summary handed
# back after one ("...produced a summary of its thinking process")
SUMMARY_ASKED = re.compile(
    r"\b(?:create|write|provide|generate)\s+(?:a|an)\s+(?:\w+\s+){0,3}summary|\bsummari[sz]e\b",
    re.I,
)
SEARCH = "<<<<<<< SEARCH"
DIVIDE = "======="
REPLACE = ">>>>>>> REPLACE"


def shell_command(sid: str, turn: int | str, output_kb: int, style: str = "hex") -> str:
    """The command of one scripted turn: a header line, then `output_kb` KB of log lines.

    `hex` lines carry a SHA-256 each (dense for tokenizers: about 2 characters a token, like
    logs full of ids and digests); `text` lines are plain English log prose (about 4.5).
    """
    lines = max(1, output_kb * 1024 // 80)
    if style == "text":
        row = (
            "print('INFO build step', i, 'compiled the module and linked every "
            "target without warnings; tests pending')"
        )
    else:
        row = f"print('row', i, hashlib.sha256(b'{sid}-{turn}-%d' % i).hexdigest())"
    program = f"import hashlib\nfor i in range({lines}):\n    {row}"
    return f"echo 'AGENTRUN sid={sid} turn={turn}'; python3 -c \"{program}\""


@dataclass(frozen=True)
class Script:
    """What the brain answers: how many turns, how large each output, the window it enforces."""

    window: int
    turns: int
    output_kb: int
    output_style: str = "hex"
    task_reply: str = "I will read each build log as you send it and report what it shows."
    token_scale: float = 1.0  # the provider's tokenizer against o200k (Claude's counts more)


class Tokens:
    """o200k counts of a request's prompt, as the brain's provider would bill it."""

    def __init__(self, directory: Path) -> None:
        self.encoding = load_encoding("o200k_base", directory)

    def text(self, value: str) -> int:
        return len(self.encoding.encode_ordinary(value)) if value else 0

    def leaves(self, value: Any) -> int:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return sum(self.leaves(v) for v in value)
        if isinstance(value, dict):
            return sum(self.leaves(v) for k, v in value.items() if k not in SKIP_KEYS)
        return 0

    def prompt(self, items: list[Any], head: Any, tools: Any) -> int:
        framing = 4 * (len(items) + (1 if head else 0)) + 3
        tool_tokens = self.text(json.dumps(tools)) if tools else 0
        return self.leaves(items) + self.leaves(head) + framing + tool_tokens


# --- reading a request --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """One request, read the same way whatever its protocol."""

    api: str  # chat | responses | anthropic
    body: dict[str, Any]
    items: list[Any]  # messages or Responses input items
    head: Any  # system / instructions
    tools: list[Any]
    reply_allowance: int
    stream: bool

    @property
    def raw(self) -> str:
        return json.dumps([self.head, self.items], ensure_ascii=False)

    def session(self) -> str | None:
        found = MARKER.search(self.raw)
        if found:
            return found.group(1)
        turn = TURN.search(self.raw)
        return turn.group(1) if turn else None

    def last_turn(self, sid: str | None) -> int:
        turns = [int(t) for s, t in TURN.findall(self.raw) if sid is None or s == sid]
        return max(turns, default=0)

    def shell_tool(self) -> tuple[str, dict[str, Any]] | None:
        """(name, JSON schema) of the shell tool the request offers, by preference."""
        offered: dict[str, dict[str, Any]] = {}
        for tool in self.tools:
            if not isinstance(tool, dict):
                continue
            spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            name = spec.get("name") or (
                tool.get("type") if tool.get("type") == "local_shell" else None
            )
            schema = (
                spec.get("parameters")
                or spec.get("parametersJsonSchema")  # Gemini CLI's declarations
                or spec.get("input_schema")
                or {}
            )
            if isinstance(name, str):
                offered[name] = schema if isinstance(schema, dict) else {}
        for name in SHELL_TOOLS:
            if name in offered:
                return name, offered[name]
        return None

    def text_of_first_system(self) -> str:
        if isinstance(self.head, str):
            return self.head
        if self.head:
            return json.dumps(self.head)
        for item in self.items:
            if isinstance(item, dict) and item.get("role") in ("system", "developer"):
                return json.dumps(item.get("content"))
        return ""

    def last_user_text(self) -> str:
        """The text of the transcript's last item when it is a user message, else ''."""
        last = self.items[-1] if self.items else None
        if isinstance(last, dict) and last.get("role", "user") == "user":
            content = last.get("content", last.get("parts"))  # Gemini's: parts
            return json.dumps(content, ensure_ascii=False)
        return ""


def read_chat(body: dict[str, Any]) -> Ask:
    allowance = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return Ask(
        "chat",
        body,
        list(body.get("messages") or []),
        None,
        list(body.get("tools") or []),
        int(allowance),
        bool(body.get("stream")),
    )


def read_responses(body: dict[str, Any]) -> Ask:
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    return Ask(
        "responses",
        body,
        items,
        body.get("instructions"),
        list(body.get("tools") or []),
        int(body.get("max_output_tokens") or 0),
        bool(body.get("stream")),
    )


def read_anthropic(body: dict[str, Any]) -> Ask:
    return Ask(
        "anthropic",
        body,
        list(body.get("messages") or []),
        body.get("system"),
        list(body.get("tools") or []),
        int(body.get("max_tokens") or 0),
        bool(body.get("stream")),
    )


def read_gemini(body: dict[str, Any]) -> Ask:
    """A Gemini API request: `contents`, `systemInstruction`, the function declarations."""
    config = body.get("generationConfig") or {}
    tools = [
        decl
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
        for decl in tool.get("functionDeclarations") or []
    ]
    return Ask(
        "gemini",
        body,
        list(body.get("contents") or []),
        body.get("systemInstruction"),
        tools,
        int(config.get("maxOutputTokens") or 0),
        False,  # the path says: set by the handler
    )


# --- deciding the answer ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Either a tool call (name, arguments) or a text."""

    text: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None


def arguments_for(schema: dict[str, Any], command: str) -> dict[str, Any]:
    """Arguments for a shell tool, shaped as its JSON schema says (array or string command)."""
    props = schema.get("properties") or {}
    args: dict[str, Any] = {}
    key = next((k for k in ("command", "cmd") if k in props), "command")
    kind = (props.get(key) or {}).get("type", "string")
    args[key] = ["bash", "-lc", command] if kind == "array" else command
    for name in schema.get("required") or []:
        if name in args:
            continue
        spec = props.get(name) or {}
        kind = spec.get("type", "string")
        if kind == "string":
            args[name] = "Print the next build log" if name == "description" else "."
        elif kind in ("integer", "number"):
            args[name] = 120000 if "timeout" in name else 1
        elif kind == "boolean":
            args[name] = False
        elif kind == "array":
            args[name] = []
        else:
            args[name] = {}
    if "description" in props and "description" not in args:
        args["description"] = "Print the next build log"
    return args


def decide(ask: Ask, script: Script) -> tuple[str, str | None, int, Answer]:
    """(kind, session, turn, answer) for one request."""
    sid = ask.session()
    turn = ask.last_turn(sid)
    shell = ask.shell_tool()
    system = ask.text_of_first_system().lower()
    asked = ask.last_user_text()[-3000:]  # a compaction prompt comes last
    if SUMMARY_ASKED.search(asked) or (shell is None and "summar" in system):
        task = MARKER.search(ask.raw)
        said = f" The task was: {task.group(0)} (fix the flaky build)." if task else ""
        last = f" Steps 1 to {turn} ran: AGENTRUN sid={sid} turn={turn}." if sid else ""
        return (
            "side",
            sid,
            turn,
            Answer(text=f"Summary: we ran build logs step by step.{said}{last}"),
        )
    if shell is not None and sid is not None:
        if turn >= script.turns:
            return "main", sid, turn, Answer(text=f"All {turn} steps are done (session {sid}).")
        name, schema = shell
        command = shell_command(sid, turn + 1, script.output_kb, script.output_style)
        return "main", sid, turn, Answer(tool=name, arguments=arguments_for(schema, command))
    if sid is not None and TURN.search(ask.last_user_text()):
        return "main", sid, turn, Answer(text=aider_reply(turn))
    if sid is not None and shell is None and not ask.tools and MARKER.search(ask.last_user_text()):
        return "main", sid, turn, Answer(text=script.task_reply)
    return "side", sid, turn, Answer(text="ok")


def aider_reply(turn: int) -> str:
    """Plain text, or every fifth turn a SEARCH/REPLACE edit creating a small new file."""
    if turn % 5:
        return f"The log of turn {turn} shows no failing row; nothing to change yet."
    return (
        f"Recording turn {turn}.\n\nnotes-{turn}.md\n```\n{SEARCH}\n{DIVIDE}\n"
        f"turn {turn}: log clean\n{REPLACE}\n```\n"
    )


# --- the provider's answers ---------------------------------------------------------------------


def overflow_error(ask: Ask, prompt: int, window: int) -> dict[str, Any]:
    """The context-length error each provider really sends (shapes as documented)."""
    if ask.api == "anthropic":
        if prompt > window:
            message = f"prompt is too long: {prompt} tokens > {window} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt} + "
                f"{ask.reply_allowance} > {window}, decrease input length or `max_tokens` "
                "and try again"
            )
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if ask.api == "responses":
        message = (
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again."
        )
        param = "input"
    else:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + ask.reply_allowance} tokens ({prompt} in the messages, "
            f"{ask.reply_allowance} in the completion). Please reduce the length of the "
            "messages or completion."
        )
        param = "messages"
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": "context_length_exceeded",
        }
    }


def gemini_signature_error(ask: Ask, issued: set[str]) -> str | None:
    """Gemini 3's refusal of a function call whose thought signature is gone (in the current
    step: since the person's last prompt) or altered (ai.google.dev/gemini-api/docs/
    thought-signatures; the wording as clients report it, e.g. chatboxai/chatbox#3308), and
    of function responses that do not pair with the call turn before them."""
    last_prompt = 0
    calls = 0
    for n, content in enumerate(ask.items):
        parts = content.get("parts") if isinstance(content, dict) else None
        parts = parts if isinstance(parts, list) else []
        answered = sum(1 for p in parts if isinstance(p, dict) and "functionResponse" in p)
        if answered != calls:
            return (
                "Please ensure that the number of function response parts is equal to the "
                "number of function call parts of the function call turn."
            )
        fn = [p for p in parts if isinstance(p, dict) and "functionCall" in p]
        calls = len(fn) if content.get("role") == "model" else 0
        if content.get("role", "user") == "user" and not answered:
            last_prompt = n
        for p in fn:
            sig = p.get("thoughtSignature")
            if sig is not None and sig not in issued:
                return "Corrupted thought signature."
    for n, content in enumerate(ask.items[last_prompt:], start=last_prompt):
        fn = [p for p in content.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]
        if fn and "thoughtSignature" not in fn[0]:
            return missing_signature(fn[0]["functionCall"].get("name"), n)
    return None


def gemini_json(schema: Any) -> Any:
    """A value of `schema` (Gemini CLI's side calls ask for JSON: who speaks next, which
    model to route to, whether it loops): enums take their first value, but the next
    speaker is the person, so the session ends when the model says it is done."""
    if not isinstance(schema, dict):
        return {}
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        values = list(schema["enum"])
        return "user" if "user" in values else values[0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: gemini_json(v) for k, v in props.items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    return "fine"


def gemini_answer(
    ask: Ask, answer: Answer, prompt: int, model: str, signature: str | None
) -> Response:
    """generateContent's answer (or streamGenerateContent's `data:` chunks, `usageMetadata` on
    each), as google-genai reads them: a thought, then the call carrying the signature."""
    config = ask.body.get("generationConfig") or {}
    if answer.tool is not None:
        call = {"name": answer.tool, "args": answer.arguments or {}}
        parts: list[dict[str, Any]] = [
            {"text": "Running the next build step.", "thought": True},
            {"functionCall": call, "thoughtSignature": signature},
        ]
    elif config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        parts = [{"text": json.dumps(gemini_json(schema))}]
    else:
        parts = [{"text": answer.text or ""}]

    def chunk(pieces: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": pieces, "role": "model"}, "index": 0}
        usage = {"promptTokenCount": prompt, "totalTokenCount": prompt + 20}
        if final:
            candidate["finishReason"] = "STOP"
            usage["candidatesTokenCount"] = 20
        return {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": new_id(""),
        }

    if not ask.stream:
        return JSONResponse(chunk(parts, True))

    async def events() -> AsyncIterator[bytes]:
        for k, part in enumerate(parts):
            data = json.dumps(chunk([part], k == len(parts) - 1))
            yield f"data: {data}\r\n\r\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream")


def gemini_error_response(status: int, message: str) -> Response:
    kind = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED"}.get(status, "INTERNAL")
    error = {"code": status, "message": message, "status": kind}
    return JSONResponse({"error": error}, status_code=status)


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def chat_answer(ask: Ask, answer: Answer, prompt: int) -> Response:
    model = ask.body.get("model", "agent-model")
    usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
    call = None
    if answer.tool is not None:
        call = {
            "id": new_id("call_"),
            "type": "function",
            "function": {"name": answer.tool, "arguments": json.dumps(answer.arguments)},
        }
    finish = "tool_calls" if call else "stop"
    rid, created = new_id("chatcmpl-"), int(time.time())
    if not ask.stream:
        message: dict[str, Any] = {"role": "assistant", "content": answer.text}
        if call:
            message["tool_calls"] = [call]
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
        )
    include_usage = bool((ask.body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    async def events() -> AsyncIterator[bytes]:
        yield chunk({"role": "assistant", "content": ""})
        if call:
            fn = call["function"]
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                }
            )
            args = fn["arguments"]
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        else:
            for part in split_text(answer.text or ""):
                yield chunk({"content": part})
        yield chunk({}, finish)
        if include_usage:
            yield sse(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def split_text(text: str) -> Iterable[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def reasoning_item(issued: set[str]) -> dict[str, Any]:
    """A reasoning item with opaque encrypted content the brain will verify when replayed."""
    sealed = base64.b64encode(secrets.token_bytes(96)).decode()
    issued.add(sealed)
    return {"type": "reasoning", "id": new_id("rs_"), "summary": [], "encrypted_content": sealed}


def replay_error(ask: Ask, issued: set[str]) -> str | None:
    """OpenAI's refusal of replayed reasoning that was altered or lost its following item."""
    for i, item in enumerate(ask.items):
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        if item.get("encrypted_content") not in issued:
            return f"The encrypted content for item {item.get('id')} could not be verified."
        after = ask.items[i + 1] if i + 1 < len(ask.items) else None
        if not isinstance(after, dict) or after.get("type") not in ("function_call", "message"):
            return (
                f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                "required following item."
            )
    return None


def responses_answer(
    ask: Ask, answer: Answer, prompt: int, reasoning: dict[str, Any] | None = None
) -> Response:
    model = ask.body.get("model", "agent-model")
    rid, created = new_id("resp_"), int(time.time())
    at = 1 if reasoning else 0  # the answer's output_index
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + 20,
    }
    if answer.tool == "local_shell":
        command = (answer.arguments or {}).get("command")
        item: dict[str, Any] = {
            "type": "local_shell_call",
            "id": new_id("lsh_"),
            "call_id": new_id("call_"),
            "status": "completed",
            "action": {"type": "exec", "command": command, "env": {}},
        }
    elif answer.tool is not None:
        item = {
            "type": "function_call",
            "id": new_id("fc_"),
            "call_id": new_id("call_"),
            "name": answer.tool,
            "arguments": json.dumps(answer.arguments),
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": new_id("msg_"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer.text or "", "annotations": []}],
        }

    def response(status: str, output: list[Any], with_usage: bool) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": model,
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": ask.body.get("tool_choice", "auto"),
            "tools": ask.tools,
            "usage": usage if with_usage else None,
            "error": None,
            "incomplete_details": None,
        }

    output = [reasoning, item] if reasoning else [item]
    if not ask.stream:
        return JSONResponse(response("completed", output, True))

    async def events() -> AsyncIterator[bytes]:
        seq = iter(range(1_000_000))

        def ev(kind: str, **data: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(seq), **data}, kind)

        yield ev("response.created", response=response("in_progress", [], False))
        yield ev("response.in_progress", response=response("in_progress", [], False))
        if reasoning:
            yield ev("response.output_item.added", output_index=0, item=reasoning)
            yield ev("response.output_item.done", output_index=0, item=reasoning)

        def of_item(kind: str, **data: Any) -> bytes:  # an event about the item streamed
            return ev(kind, item_id=item["id"], output_index=at, **data)

        if item["type"] == "function_call":
            yield ev(
                "response.output_item.added",
                output_index=at,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                yield of_item("response.function_call_arguments.delta", delta=piece)
            yield of_item("response.function_call_arguments.done", arguments=args)
        elif item["type"] == "message":
            text = answer.text or ""
            yield ev(
                "response.output_item.added",
                output_index=at,
                item={**item, "content": [], "status": "in_progress"},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield of_item("response.content_part.added", content_index=0, part=part)
            for piece in split_text(text):
                yield of_item("response.output_text.delta", content_index=0, delta=piece)
            yield of_item("response.output_text.done", content_index=0, text=text)
            yield of_item(
                "response.content_part.done", content_index=0, part={**part, "text": text}
            )
        else:
            yield ev("response.output_item.added", output_index=at, item=item)
        yield ev("response.output_item.done", output_index=at, item=item)
        yield ev("response.completed", response=response("completed", output, True))

    return StreamingResponse(events(), media_type="text/event-stream")


def thinking_error(ask: Ask, issued: set[str]) -> str | None:
    """Anthropic's refusal of thinking blocks that were altered, or missing where required."""
    last_assistant = None
    for i, message in enumerate(ask.items):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        if message.get("role") == "assistant":
            last_assistant = i
        for j, part in enumerate(content):
            altered = isinstance(part, dict) and part.get("type") == "thinking"
            if altered and part.get("signature") not in issued:
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    thinking = ask.body.get("thinking") or {}
    if last_assistant is None or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    content = ask.items[last_assistant].get("content")
    first = content[0] if isinstance(content, list) and content else None
    calls = isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "tool_use" for p in content
    )
    if calls and (not isinstance(first, dict) or first.get("type") not in THINKING):
        found = first.get("type") if isinstance(first, dict) else "text"
        return (
            f"messages.{last_assistant}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{found}`. When `thinking` is enabled, a final "
            "`assistant` message must start with a thinking block (preceeding the lastmost "
            "set of `tool_use` and `tool_result` blocks)."
        )
    return None


def anthropic_answer(
    ask: Ask, answer: Answer, prompt: int, signature: str | None = None
) -> Response:
    model = ask.body.get("model", "agent-model")
    mid = new_id("msg_")
    thought = {"type": "thinking", "thinking": "", "signature": signature} if signature else None
    at = 1 if thought else 0  # the answer's content index
    if answer.tool is not None:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": new_id("toolu_"),
            "name": answer.tool,
            "input": answer.arguments or {},
        }
        stop = "tool_use"
    else:
        block = {"type": "text", "text": answer.text or ""}
        stop = "end_turn"
    usage = {
        "input_tokens": prompt,
        "output_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    message = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [thought, block] if thought else [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not ask.stream:
        return JSONResponse(message)

    async def events() -> AsyncIterator[bytes]:
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield sse({"type": "message_start", "message": start}, "message_start")
        if thought:
            opened_thought = {**thought, "signature": ""}
            yield sse(
                {"type": "content_block_start", "index": 0, "content_block": opened_thought},
                "content_block_start",
            )
            delta = {"type": "signature_delta", "signature": thought["signature"]}
            yield sse(
                {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
            )
            yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            yield sse(
                {"type": "content_block_start", "index": at, "content_block": opened},
                "content_block_start",
            )
            args = json.dumps(block["input"])
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"type": "input_json_delta", "partial_json": part}
                yield sse(
                    {"type": "content_block_delta", "index": at, "delta": delta},
                    "content_block_delta",
                )
        else:
            yield sse(
                {
                    "type": "content_block_start",
                    "index": at,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
            for piece in split_text(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                yield sse(
                    {"type": "content_block_delta", "index": at, "delta": delta},
                    "content_block_delta",
                )
        yield sse({"type": "content_block_stop", "index": at}, "content_block_stop")
        yield sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            },
            "message_delta",
        )
        yield sse({"type": "message_stop"}, "message_stop")

    return StreamingResponse(events(), media_type="text/event-stream")


# --- the app ------------------------------------------------------------------------------------


class Brain:
    """The provider: reads, counts, refuses or answers, and logs one line per request."""

    def __init__(self, script: Script, tokens: Tokens, log: Path, dump: Path | None = None) -> None:
        self.script = script
        self.tokens = tokens
        self.log = log.open("a", encoding="utf-8")
        self.dump = dump  # a folder for every request body, numbered, when set
        self.seen = 0
        self.issued: set[str] = set()  # encrypted reasoning handed out (Responses)

    def record(self, **fields: Any) -> None:
        self.log.write(json.dumps({"t": round(time.time(), 4), **fields}) + "\n")
        self.log.flush()

    async def handle(self, request: Request, api: str) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "bad json"}}, status_code=400)
        self.seen += 1
        if self.dump is not None:
            (self.dump / f"{self.seen:04d}-{api}.json").write_text(json.dumps(body))
        reader = {"chat": read_chat, "responses": read_responses, "anthropic": read_anthropic}
        ask = reader[api](body)
        prompt = round(self.tokens.prompt(ask.items, ask.head, ask.tools) * self.script.token_scale)
        kind, sid, turn, answer = decide(ask, self.script)
        over = prompt + ask.reply_allowance > self.script.window
        marker = f"TASK-MARKER-{sid}" if sid else None
        session_headers = {
            k: v for k, v in request.headers.items() if "session" in k or "conversation" in k
        }
        self.record(
            api=api,
            path=request.url.path,
            model=ask.body.get("model"),
            stream=ask.stream,
            kind=kind,
            sid=sid,
            turn=turn,
            prompt=prompt,
            allowance=ask.reply_allowance,
            items=len(ask.items),
            overflow=over,
            task=bool(marker and marker in ask.raw),
            answer="tool" if answer.tool else "text",
            tool=answer.tool,
            headers=session_headers,
            ua=request.headers.get("user-agent", "")[:80],
        )
        if over:
            return JSONResponse(overflow_error(ask, prompt, self.script.window), status_code=400)
        refused = (
            replay_error(ask, self.issued)
            if api == "responses"
            else thinking_error(ask, self.issued)
            if api == "anthropic"
            else None
        )
        if refused is not None:
            self.record(api=api, kind="refused", sid=sid, message=refused)
            if api == "anthropic":
                error = {"type": "invalid_request_error", "message": refused}
                return JSONResponse({"type": "error", "error": error}, status_code=400)
            error = {"message": refused, "type": "invalid_request_error", "param": "input"}
            return JSONResponse({"error": {**error, "code": None}}, status_code=400)
        if api == "chat":
            return chat_answer(ask, answer, prompt)
        if api == "responses":
            wants = "reasoning.encrypted_content" in (ask.body.get("include") or [])
            reasoning = reasoning_item(self.issued) if wants and answer.tool else None
            return responses_answer(ask, answer, prompt, reasoning)
        thinks = (ask.body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
        signature = reasoning_item(self.issued)["encrypted_content"] if thinks else None
        return anthropic_answer(ask, answer, prompt, signature if answer.tool else None)

    async def gemini(self, request: Request) -> Response:
        """`models/{model}:generateContent`, `:streamGenerateContent`, `:countTokens`."""
        model, _, verb = str(request.path_params["target"]).partition(":")
        body = await request.json()
        self.seen += 1
        if self.dump is not None:
            (self.dump / f"{self.seen:04d}-gemini.json").write_text(json.dumps(body))
        ask = read_gemini(body)
        ask = Ask(**{**ask.__dict__, "stream": verb == "streamGenerateContent"})
        prompt = round(self.tokens.prompt(ask.items, ask.head, ask.tools) * self.script.token_scale)
        if verb == "countTokens":
            self.record(api="gemini", path=request.url.path, kind="count", prompt=prompt)
            return JSONResponse({"totalTokens": prompt})
        kind, sid, turn, answer = decide(ask, self.script)
        over = prompt > self.script.window  # Gemini's input limit stands apart from the output's
        marker = f"TASK-MARKER-{sid}" if sid else None
        signed = [
            p["thoughtSignature"]
            for c in ask.items
            if isinstance(c, dict)
            for p in c.get("parts") or []
            if isinstance(p, dict) and "thoughtSignature" in p
        ]
        self.record(
            api="gemini", path=request.url.path, model=model, stream=ask.stream, kind=kind,
            sid=sid, turn=turn, prompt=prompt, allowance=ask.reply_allowance,
            items=len(ask.items), overflow=over, task=bool(marker and marker in ask.raw),
            answer="tool" if answer.tool else "text", tool=answer.tool,
            signatures=len(signed), headers=dict(request.headers) if self.seen < 3 else {},
            ua=request.headers.get("user-agent", "")[:80],
        )  # fmt: skip
        if not (request.headers.get("x-goog-api-key") or request.query_params.get("key")):
            return gemini_error_response(403, "Method doesn't allow unregistered callers.")
        if over:
            message = (
                f"The input token count ({prompt}) exceeds the maximum number of tokens "
                f"allowed ({self.script.window})."
            )
            return gemini_error_response(400, message)
        refused = gemini_signature_error(ask, self.issued)
        if refused is not None:
            self.record(api="gemini", kind="refused", sid=sid, message=refused)
            return gemini_error_response(400, refused)
        signature = reasoning_item(self.issued)["encrypted_content"] if answer.tool else None
        return gemini_answer(ask, answer, prompt, model, signature)

    async def count_tokens(self, request: Request) -> Response:
        ask = read_anthropic(await request.json())
        prompt = self.tokens.prompt(ask.items, ask.head, ask.tools)
        self.record(api="anthropic", path=request.url.path, kind="count", prompt=prompt)
        return JSONResponse({"input_tokens": prompt})

    async def models(self, request: Request) -> Response:
        self.record(api="models", path=request.url.path, kind="models")
        model = {
            "id": "agent-model",
            "object": "model",
            "created": 0,
            "owned_by": "brain",
            "type": "model",
            "display_name": "agent-model",
            "created_at": "2026-01-01T00:00:00Z",
        }
        return JSONResponse(
            {
                "object": "list",
                "data": [model],
                "has_more": False,
                "first_id": "agent-model",
                "last_id": "agent-model",
            }
        )

    async def other(self, request: Request) -> Response:
        self.record(api="other", path=request.url.path, method=request.method, kind="other")
        return JSONResponse({"error": {"message": "not found", "type": "not_found"}}, 404)

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            return await self.handle(request, "chat")

        async def responses(request: Request) -> Response:
            return await self.handle(request, "responses")

        async def messages(request: Request) -> Response:
            return await self.handle(request, "anthropic")

        methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/chat/completions", chat, methods=["POST"]),
                Route("/v1/responses", responses, methods=["POST"]),
                Route("/responses", responses, methods=["POST"]),
                Route("/v1/messages", messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1beta/models/{target}", self.gemini, methods=["POST"]),
                Route("/v1/models/{target}", self.gemini, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/models", self.models, methods=["GET"]),
                Route("/{path:path}", self.other, methods=methods),
            ]
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--output-kb", type=int, default=24)
    parser.add_argument("--output-style", choices=("hex", "text"), default="hex")
    parser.add_argument("--tiktoken-dir", type=Path, default=Path("/work/shared/tiktoken"))
    parser.add_argument(
        "--task-reply",
        default=Script.task_reply,
        help="the answer to a tool-less client's task message (aider), e.g. a short "
        "'Understood. Send me the first build log.'",
    )
    parser.add_argument("--token-scale", type=float, default=1.0, help="counts x this")
    parser.add_argument("--dump-dir", type=Path, help="write every request body here")
    args = parser.parse_args()
    if args.dump_dir is not None:
        args.dump_dir.mkdir(parents=True, exist_ok=True)
    script = Script(
        args.window,
        args.turns,
        args.output_kb,
        args.output_style,
        args.task_reply,
        args.token_scale,
    )
    brain = Brain(script, Tokens(args.tiktoken_dir), args.log, args.dump_dir)
    uvicorn.run(brain.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
