"""Message builders of the tests: single messages, tool calls and their results, sample chats.

The sample chats differ on purpose: each suite asserts exact sizes and texts of its own
(`chat` for the API's budget, `task_chat` for the worker's trigger, `numbered_chat` for the
store's keys), so each keeps its shape under a name of its own.
"""

from __future__ import annotations

import json
from typing import Any

from shared.messages import Message


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def system(text: str) -> Message:
    return {"role": "system", "content": text}


def tool_call(
    call_id: str, name: str = "bash", args: str | dict[str, Any] = '{"cmd": "ls"}'
) -> dict[str, Any]:
    """One entry of an assistant's `tool_calls` (arguments given as a dict are JSON-encoded)."""
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calling(*calls: dict[str, Any], content: str | None = None) -> Message:
    """An assistant message making these tool calls (parallel when there are several)."""
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def call(
    call_id: str,
    name: str = "bash",
    args: str | dict[str, Any] = '{"cmd": "ls"}',
    *,
    content: str | None = None,
) -> Message:
    """An assistant message calling one tool."""
    return calling(tool_call(call_id, name, args), content=content)


def result(call_id: str, content: Any) -> Message:
    """A tool's output for the call `call_id`."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_turn(
    call_id: str, name: str, args: str, output: str, content: str | None = None
) -> list[Message]:
    """An assistant message calling one tool, and the tool's result."""
    return [call(call_id, name, args, content=content), result(call_id, output)]


def chat(turns: int, size: int = 400, *, system: bool = True) -> list[Message]:
    """A plain chat of `turns` user/assistant pairs, each message about `size` characters."""
    out: list[Message] = [{"role": "system", "content": "You are terse."}] if system else []
    for i in range(turns):
        out.append(user(f"question {i} " + "q" * size))
        out.append(assistant(f"answer {i} " + "a" * size))
    return out


def task_chat(n: int, tag: str = "m", size: int = 400) -> list[Message]:
    """A head, then n turns of user/assistant messages of ~size chars, each text unique."""
    msgs: list[Message] = [
        {"role": "system", "content": f"{tag} system"},
        {"role": "user", "content": f"{tag} task"},
    ]
    for i in range(n):
        role = "assistant" if i % 2 else "user"
        msgs.append({"role": role, "content": f"{tag}-{i} " + "lorem ipsum " * (size // 12)})
    return msgs


def numbered_chat(n: int, tag: str = "m") -> list[Message]:
    """n alternating user/assistant messages with distinct text."""
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"{tag}{i}"} for i in range(n)]


def agent_chat(n: int, size: int = 400) -> list[Message]:
    """A system prompt and a task, then n agent steps: a call, its ~size-char output, a note."""
    msgs: list[Message] = [system("be brief"), user("task")]
    for i in range(n):
        msgs.append(call("c", "bash", f'{{"i": {i}}}'))
        msgs.append(result("c", f"out {i} " + "y" * size))
        msgs.append(assistant(f"step {i} done " + "z" * (size // 4)))
    return msgs


def wordy_chat(n: int) -> list[Message]:
    """A request, then n assistant/user pairs of many words (for counters that count words)."""
    msgs: list[Message] = [user("plan a trip")]
    for i in range(n):
        msgs.append(assistant(f"idea {i} " + "word " * 120))
        msgs.append(user(f"more {i} " + "word " * 40))
    return msgs
