"""Message builders and small helpers shared by the API tests."""

from __future__ import annotations

import uuid
from typing import Any

from shared.messages import Message


def conv_id() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def call(call_id: str, name: str = "bash", args: str = '{"cmd": "ls"}') -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        ],
    }


def result(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def chat(turns: int, size: int = 400, *, system: bool = True) -> list[Message]:
    """A plain chat of `turns` user/assistant pairs, each message about `size` characters."""
    out: list[Message] = [{"role": "system", "content": "You are terse."}] if system else []
    for i in range(turns):
        out.append(user(f"question {i} " + "q" * size))
        out.append(assistant(f"answer {i} " + "a" * size))
    return out


def body(messages: list[Message], model: str, **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "model": model, **extra}
