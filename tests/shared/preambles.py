"""Conversations a tenant opens with a fixed preamble: a long instruction block as the first
user message, a reply that is no canned acknowledgment, then the person's task."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]

SYSTEM: Message = {"role": "system", "content": "You are the team's coding agent."}
PREAMBLE = "Team conventions for every change you make in this repository.\n" + (
    "Keep functions short, name modules after domain nouns, test what you change. " * 20
)
READ = "I have read the conventions. I will check the layout and the tests before editing."


def opened(task: str) -> list[Message]:
    """The first prompt of a conversation on `task`, behind the preamble."""
    return [
        SYSTEM,
        {"role": "user", "content": PREAMBLE},
        {"role": "assistant", "content": READ},
        {"role": "user", "content": task},
    ]


def prompts(task: str, steps: int, output_chars: int = 2400) -> list[list[Message]]:
    """The prompt at each step of a session on `task`: a tool call with a long output, a
    long answer, and the person's next word."""
    out, done = [], opened(task)
    for k in range(steps):
        out.append(list(done))
        args = f'{{"cmd": "grep -rn step_{k} src/"}}'
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": args}}
        done += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "hit " * (output_chars // 4)},
            {"role": "assistant", "content": f"Step {k}: " + "found more " * (output_chars // 20)},
            {"role": "user", "content": f"Good, go on with step {k + 1}."},
        ]
    return out
