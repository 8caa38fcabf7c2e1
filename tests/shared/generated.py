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
