"""Hypothesis strategies for transcripts: heads, plain turns, parallel tool calls (results in
any order), pending calls, content as parts (text and images), names, mid-conversation
system and developer messages, follow-up requests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


def _repeat(s: str, n: int) -> str:
    s = s or "x"
    return s * max(1, n // len(s))


sized = st.builds(_repeat, text, st.integers(0, 3000))  # from a word to a few pages
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBOR" * 4000}}


@st.composite
def any_content(draw: st.DrawFn) -> str | list[dict[str, Any]]:
    """A string, or a list of text parts with maybe an image (as SDKs and screenshots send)."""
    body = draw(sized)
    if draw(st.integers(0, 4)):
        return body
    parts: list[dict[str, Any]] = [{"type": "text", "text": body}]
    return [*parts, IMAGE] if draw(st.booleans()) else [*parts, {"type": "text", "text": ""}]


@st.composite
def tool_group(draw: st.DrawFn, n: int) -> list[dict[str, Any]]:
    k = draw(st.integers(1, 4))
    ids = [f"call_{draw(st.integers(0, 3))}_{j}" for j in range(k)]  # ids repeat across groups
    calls = [
        {"id": i, "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
        for i in ids
    ]
    content = draw(st.sampled_from([None, "", "let me look"]))
    group: list[dict[str, Any]] = [{"role": "assistant", "content": content, "tool_calls": calls}]
    order = draw(st.permutations(ids))  # parallel calls' results come back in any order
    group += [{"role": "tool", "tool_call_id": i, "content": draw(any_content())} for i in order]
    return group


GREETINGS = ("Hi! How can I help you today?", "Hello, this is the airline desk. What can I do?")


@st.composite
def opening(draw: st.DrawFn) -> list[dict[str, Any]]:
    """What precedes the task: nothing, an agent's greeting, or an agent that worked first."""
    kind = draw(st.sampled_from(["none", "none", "greeting", "worked"]))
    if kind == "greeting":
        return [{"role": "assistant", "content": draw(st.sampled_from(GREETINGS))}]
    if kind == "worked":
        out: list[dict[str, Any]] = []
        for n in range(draw(st.integers(2, 4))):
            out += draw(tool_group(n))
        return out
    return []


@st.composite
def transcripts(draw: st.DrawFn, max_groups: int = 30) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(sized)})
    msgs += draw(opening())
    msgs.append({"role": "user", "content": draw(sized)})
    kinds = ["user", "assistant", "tools", "tools", "tools", "system", "developer"]
    for n in range(draw(st.integers(0, max_groups))):
        kind = draw(st.sampled_from(kinds))
        if kind == "tools":
            msgs += draw(tool_group(n))
        else:
            msgs.append({"role": kind, "content": draw(any_content())})
            if kind == "user" and draw(st.integers(0, 3)) == 0:
                msgs[-1]["name"] = "customer"
    if draw(st.booleans()):  # a trailing call nobody answered yet
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "last",
                        "type": "function",
                        "function": {"name": "Finish", "arguments": "{}"},
                    }
                ],
            }
        )
    return msgs


REMINDER = "<system-reminder>\nThe TodoWrite tool hasn't been used recently.\n</system-reminder>"


def _thinking_block(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 5)) == 0:
        return {"type": "redacted_thinking", "data": "EmwKAhgB" * draw(st.integers(1, 40))}
    return {"type": "thinking", "thinking": draw(sized), "signature": "ErUBCkYIBRgC" * 8}


@st.composite
def thinking_sessions(draw: st.DrawFn, max_turns: int = 5) -> tuple[Any, list[dict[str, Any]]]:
    """Anthropic Messages sessions with extended thinking, as Claude Code sends them:
    `(system, messages)`. Each turn is a person's request (a `<system-reminder>` block before
    it, sometimes; a lone reminder message before it, sometimes), then a tool loop whose first
    assistant message starts with a thinking block (with interleaved thinking, later steps
    too), parallel calls, reminders after tool results in the same user turn (the step after
    one thinks too: a user turn that is not only tool results opens a turn, to Anthropic's
    strictest reading), and a final answer, or the loop still running at the end."""
    system = [{"type": "text", "text": "You are Claude Code. " + draw(sized)}]
    out: list[dict[str, Any]] = []
    turns = draw(st.integers(1, max_turns))
    ids = 0
    for t in range(turns):
        if t and draw(st.integers(0, 3)) == 0:
            out.append({"role": "user", "content": REMINDER})
        request: list[dict[str, Any]] = [{"type": "text", "text": "Please " + draw(sized)}]
        if draw(st.booleans()):
            request.insert(0, {"type": "text", "text": REMINDER})
        out.append({"role": "user", "content": request})
        steps = draw(st.integers(0, 8))
        interleaved = draw(st.booleans())
        reminded = False
        for k in range(steps):
            content: list[dict[str, Any]] = []
            if k == 0 or reminded or (interleaved and draw(st.booleans())):
                content.append(_thinking_block(draw))
            if draw(st.booleans()):
                content.append({"type": "text", "text": draw(sized)})
            uses = []
            for _ in range(draw(st.integers(1, 3))):
                ids += 1
                uses.append(
                    {"type": "tool_use", "id": f"toolu_{ids}", "name": "Bash", "input": {"n": ids}}
                )
            out.append({"role": "assistant", "content": content + uses})
            results: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": u["id"], "content": draw(sized)}
                for u in uses
            ]
            reminded = draw(st.integers(0, 2)) == 0
            if reminded:
                results.append({"type": "text", "text": REMINDER})
            out.append({"role": "user", "content": results})
        if t < turns - 1 or steps == 0 or draw(st.booleans()):
            answer: list[dict[str, Any]] = [{"type": "text", "text": draw(sized)}]
            if steps == 0 or reminded or (interleaved and draw(st.booleans())):
                answer.insert(0, _thinking_block(draw))
            out.append({"role": "assistant", "content": answer})
    return system, out


@st.composite
def reasoning_sessions(draw: st.DrawFn, max_turns: int = 4) -> list[dict[str, Any]]:
    """Responses API `input` items of a reasoning model's sessions, as Codex sends them:
    each step a `reasoning` item with its `encrypted_content` followed by the item it
    produced (a `function_call`, or the closing message), outputs after their calls."""
    items: list[dict[str, Any]] = []
    calls = 0
    for t in range(draw(st.integers(1, max_turns))):
        if not t:
            items.append(_input("<environment_context>\n<cwd>/repo</cwd>\n</environment_context>"))
        items.append(_input("Please " + draw(sized)))
        for _ in range(draw(st.integers(0, 6))):
            calls += 1
            items.append(_reasoning(calls, draw))
            items.append(
                {
                    "type": "function_call",
                    "call_id": f"call_{calls}",
                    "name": "shell",
                    "arguments": '{"command": ["ls"]}',
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": f"call_{calls}", "output": draw(sized)}
            )
        if draw(st.booleans()):
            calls += 1
            items.append(_reasoning(calls, draw))
            text = [{"type": "output_text", "text": draw(sized)}]
            items.append({"type": "message", "role": "assistant", "content": text})
    return items


def _input(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _reasoning(n: int, draw: st.DrawFn) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{n}",
        "summary": [{"type": "summary_text", "text": draw(text)}],
        "encrypted_content": "gAAAAAB" * draw(st.integers(1, 200)),
    }
