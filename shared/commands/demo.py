"""`prefit demo`: replay a conversation against a running service and show what prepare does.

One turn group at a time: append it (stating the expected length), then prepare, then print
one line: a bar of the prepared prompt's tokens against the window, the conversation's state,
the summary prepare used (`upto`), and prepare's latency. A summary landing is highlighted.
`generate_conversation` makes a deterministic agent session, so a fresh clone can demo.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from shared.client import AppendResult, PrefitClient, PreparedPrompt
from shared.errors import DoesNotFit, InvalidTranscript
from shared.messages import Message, ToolSpec, groups, validate

BAR_WIDTH = 24
_BOLD_GREEN, _DIM, _RESET = "\x1b[1;32m", "\x1b[2m", "\x1b[0m"
_SHORT = {
    "TruncateToolResults": "truncated",
    "ClearToolResults": "cleared",
    "DropOldest": "dropped",
    "Summarize": "",
}


@dataclass(frozen=True)
class DemoOptions:
    model: str = "gpt-4o"
    window: int | None = None  # None: the service's window for `model` (PREFIT_MODELS)
    conversation_id: str = ""
    wait_ms: int = 0
    pace_s: float = 0.0  # pause between turns, as a user would
    color: bool = False


def load_conversation(path: Path) -> tuple[list[Message], list[ToolSpec]]:
    """Messages and tools of a transcript file: `{"messages", "tools"?}` or a bare list."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return validate(data), []
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        return validate(data["messages"]), list(data.get("tools") or [])
    raise InvalidTranscript(f"{path.name}: expected {{'messages': [...]}} or a list of messages")


def replay(
    client: PrefitClient,
    messages: list[Message],
    tools: list[ToolSpec],
    opts: DemoOptions,
    out: TextIO,
) -> int:
    """Replay `messages` turn group by turn group; return the exit code."""
    conv = opts.conversation_id or f"demo-{uuid.uuid4().hex[:8]}"
    spans = groups(messages)
    window = opts.window  # the service says which one is in force with its first prepare
    last_upto: int | None = None
    latencies: list[float] = []
    landed = 0
    for k, (i, j) in enumerate(spans, 1):
        appended = _append(client, conv, messages[i:j], tools, opts, first=k == 1, length=i)
        started = time.perf_counter()
        try:
            prepared = client.prepare(
                conv,
                model=opts.model,
                tools=tools,
                wait_ms=opts.wait_ms,
                max_input_tokens=opts.window,
            )
        except DoesNotFit as exc:
            if k == 1:
                _header(out, conv, messages, spans, opts.model, window)
            print(f"{_turn(k, len(spans), messages[i])}  does not fit: {exc}", file=out)
            continue
        latencies.append((time.perf_counter() - started) * 1000)
        if k == 1:
            window = _window_in_force(prepared, window)
            _header(out, conv, messages, spans, opts.model, window)
        upto = _upto(prepared)
        new = upto is not None and upto != last_upto
        landed += new
        last_upto = upto
        turn = _turn(k, len(spans), messages[i])
        line = _line(turn, appended, prepared, latencies[-1], window, opts.color)
        print(_highlight(line, opts.color) if new else line, file=out, flush=True)
        if opts.pace_s:
            time.sleep(opts.pace_s)
    if latencies:
        print(
            f"{len(spans)} turns appended to {conv}; {landed} summaries landed; prepare "
            f"median {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms",
            file=out,
        )
    return 0


def _header(
    out: TextIO,
    conv: str,
    messages: list[Message],
    spans: list[tuple[int, int]],
    model: str,
    window: int | None,
) -> None:
    in_force = f"window {window:,} tokens" if window else "window unknown"
    print(
        f"conversation {conv}: {len(messages)} messages in {len(spans)} turns, "
        f"model {model}, {in_force}",
        file=out,
    )
    print(
        "columns: turn, what it added, prepared prompt / window of the stored conversation's "
        "tokens, state, summary used, other strategies, prepare latency",
        file=out,
    )


def _window_in_force(prepared: PreparedPrompt, asked: int | None) -> int | None:
    """The window the service fitted to (its report's), else the one the demo asked for."""
    window = prepared.report.get("window")
    return int(window) if isinstance(window, int) and window > 0 else asked


def _append(
    client: PrefitClient,
    conv: str,
    batch: list[Message],
    tools: list[ToolSpec],
    opts: DemoOptions,
    *,
    first: bool,
    length: int,
) -> AppendResult:
    # The first turn replaces, so replaying under a fixed --conversation id starts afresh.
    if first:
        return client.replace(
            conv, batch, model=opts.model, max_input_tokens=opts.window, tools=tools
        )
    return client.append(
        conv,
        batch,
        model=opts.model,
        expected_length=length,
        max_input_tokens=opts.window,
        tools=tools,
    )


def _upto(prepared: PreparedPrompt) -> int | None:
    summary = prepared.report.get("summary")
    return int(summary["upto"]) if isinstance(summary, dict) and "upto" in summary else None


def _turn(k: int, n: int, first: Message) -> str:
    calls = first.get("tool_calls") or []
    label = f"tools x{len(calls)}" if calls else str(first.get("role"))
    return f"{k:>4}/{n:<4} {label:<10}"


def _line(
    turn: str,
    appended: AppendResult,
    prepared: PreparedPrompt,
    ms: float,
    window: int | None,
    color: bool,
) -> str:
    scale = window or max(1, prepared.tokens)
    filled = round(min(prepared.tokens, scale) / scale * BAR_WIDTH)
    bar = "█" * filled + "░" * (BAR_WIDTH - filled)
    if color:
        bar = bar[:filled] + _DIM + bar[filled:] + _RESET
    upto = _upto(prepared)
    summary = f"summary@{upto}" if upto is not None else "no summary"
    if prepared.report.get("stale"):
        summary += " (stale)"
    return (
        f"{turn} {bar} {prepared.tokens:>7,}/{window or 0:,} of {appended.tokens:>7,}  "
        f"{appended.state:<7}  {summary:<18} {_applied(prepared):<16} {ms:6.1f} ms"
    )


def _applied(prepared: PreparedPrompt) -> str:
    """The cheap strategies prepare applied (the summary has its own column)."""
    applied = prepared.report.get("applied") or []
    names = [_SHORT.get(str(a.get("strategy")), str(a.get("strategy"))) for a in applied]
    return "+".join(n for n in names if n) or "-"


def _highlight(line: str, color: bool) -> str:
    marked = f"{line}  << summary landed"
    return f"{_BOLD_GREEN}{marked}{_RESET}" if color else marked


# --- a synthetic agent session -----------------------------------------------------------------

_VOCABULARY = """cache worker summary queue token window budget redis lease prefix hash record
batch retry model prompt transcript policy strategy counter ratio tenant store index chunk
latency request response handler config schema payload stream buffer offset"""
_WORDS = _VOCABULARY.split()
_FILES = ["src/app.py", "src/store.py", "src/policy.py", "src/queue.py", "tests/test_app.py"]
TOOLS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": text,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"}},
                "required": [arg],
            },
        },
    }
    for name, text, arg in (
        ("bash", "Run a shell command", "command"),
        ("read_file", "Read a file of the repository", "path"),
    )
]


def _words(rnd: random.Random, n: int) -> str:
    return " ".join(rnd.choice(_WORDS) for _ in range(n))


def _output(rnd: random.Random, tool: str) -> str:
    if tool == "read_file":
        return "\n".join(
            f"def {rnd.choice(_WORDS)}_{rnd.choice(_WORDS)}(x):\n    return {_words(rnd, 6)}"
            for _ in range(rnd.randint(4, 16))
        )
    return "\n".join(
        f"{rnd.choice(_FILES)}:{rnd.randint(1, 400)}: {_words(rnd, 9)}"
        for _ in range(rnd.randint(3, 14))
    )


def generate_conversation(turns: int = 60, seed: int = 7) -> tuple[list[Message], list[ToolSpec]]:
    """A deterministic coding-agent session: `turns` tool calls, with user follow-ups."""
    rnd = random.Random(seed)
    msgs: list[Message] = [
        {"role": "system", "content": "You are a careful coding agent. Use the tools."},
        {"role": "user", "content": f"Please find why the {_words(rnd, 3)} is slow and fix it."},
    ]
    for t in range(turns):
        if t and t % 4 == 0:  # prose that only a summary can shorten, not clearing tool output
            msgs.append({"role": "user", "content": f"Also check the {_words(rnd, 40)}."})
        tool = rnd.choice(["bash", "read_file"])
        args: dict[str, Any] = (
            {"path": rnd.choice(_FILES)}
            if tool == "read_file"
            else {"command": f"grep -rn {rnd.choice(_WORDS)} src/"}
        )
        call = {
            "id": f"call_{t}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(args)},
        }
        msgs.append(
            {
                "role": "assistant",
                "content": _words(rnd, rnd.randint(60, 220)),
                "tool_calls": [call],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": _output(rnd, tool)})
    msgs.append({"role": "assistant", "content": f"Done: {_words(rnd, 20)}."})
    return msgs, TOOLS
