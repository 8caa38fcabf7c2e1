"""Anthropic Messages format <-> the OpenAI chat format prefit works in, losslessly.

`to_anthropic(from_anthropic(system, messages)) == (system, messages)` for every valid input.
Anthropic blocks with an OpenAI twin are mapped (text parts stay as they are, `tool_use` becomes
`tool_calls`, each `tool_result` a `tool` message); what has no twin rides along unchanged,
either as a content part of its own type (images, documents, thinking) or under an
`"anthropic"` key of the OpenAI dict. A message's `"anthropic"` key may hold:

- `block`: the extra keys of the `tool_result` block a tool message came from (`is_error`,
  `cache_control`, ...); `no_content`: that block had no `content` at all;
- `continues`: this user message holds the blocks that followed the tool results of the same
  Anthropic user turn (OpenAI needs them as a separate message after the tool messages);
- `tool_use_at`: where the `tool_use` blocks sat among an assistant's blocks, when not last;
- `in_messages`: this system message was one of the messages (`role: system`, as SDK 2.x
  allows), not the `system` parameter, and goes back there, in place.

Tool calls and tool specs keep their extra keys (`cache_control`, ...) under `"anthropic"` too.
Strategies may rewrite tool message content afterwards: the markers only add what the current
content lacks, so a placeholder or a truncated output converts back as it now is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from shared.errors import InvalidTranscript
from shared.formats.blocks import (
    OPAQUE_BLOCKS,
    check_system,
    check_tool_spec,
    user_blocks,
    validate_message,
)
from shared.messages import HEAD_ROLES, Message, ToolSpec, validate

__all__ = [
    "Sent",
    "call_ids",
    "converted_message",
    "from_anthropic",
    "to_anthropic",
    "tools_from_anthropic",
    "tools_to_anthropic",
    "unmarked",
]

System = str | list[dict[str, Any]] | None


# --- Anthropic -> OpenAI ---------------------------------------------------------------------


def from_anthropic(
    system: System, messages: Sequence[dict[str, Any]], *, previous: Message | None = None
) -> list[Message]:
    """OpenAI-format messages for an Anthropic request's `system` and `messages`.

    `previous` is the stored message the batch follows (when appending to a conversation), so
    tool results at the batch's start can answer the tool calls stored before it.
    """
    check_system(system)
    if not isinstance(messages, list | tuple):
        raise InvalidTranscript(f"messages must be a list, got {type(messages).__name__}")
    out: list[Message] = [] if system is None else [{"role": "system", "content": system}]
    pending = call_ids(previous) if previous is not None else None
    for i, m in enumerate(messages):
        validate_message(m, i, pending)
        converted = converted_message(m)
        pending = call_ids(converted[-1])
        out.extend(converted)
    return out


def converted_message(m: dict[str, Any]) -> list[Message]:
    """The OpenAI-format messages of one valid Anthropic message (`validate_message`)."""
    if m["role"] == "assistant":
        return [_assistant(m["content"])]
    if m["role"] == "system":
        return [{"role": "system", "content": m["content"], "anthropic": {"in_messages": True}}]
    return _user(m["content"])


def unmarked(m: dict[str, Any]) -> dict[str, Any]:
    """`m` without the `cache_control` markers of its blocks (`m` itself when it has none;
    a lone marked text block becomes the string it marked). Clients move markers between
    turns (Claude Code marks the last message), so a message that lost its marker would
    otherwise differ from the same message stored a turn ago."""
    content = m.get("content")
    if not isinstance(content, list) or not any(
        isinstance(b, dict) and "cache_control" in b for b in content
    ):
        return m
    blocks = [
        {k: v for k, v in b.items() if k != "cache_control"}
        if isinstance(b, dict) and "cache_control" in b
        else b
        for b in content
    ]
    if len(blocks) == 1 and blocks[0].keys() == {"type", "text"} and blocks[0]["type"] == "text":
        # a plain prompt is a string, but a text block to carry its marker (Claude Code)
        return {**m, "content": blocks[0]["text"]}
    return {**m, "content": blocks}


def call_ids(m: Message) -> set[str] | None:
    """The tool-call ids the message after `m` may answer (None unless `m` makes calls)."""
    calls = m.get("tool_calls") if m.get("role") == "assistant" else None
    return {c["id"] for c in calls} if calls else None


def _assistant(content: str | list[dict[str, Any]]) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    at = [k for k, b in enumerate(content) if b["type"] == "tool_use"]
    if not at:
        return {"role": "assistant", "content": list(content)}
    parts = [b for b in content if b["type"] != "tool_use"]
    msg: Message = {
        "role": "assistant",
        "content": parts or None,
        "tool_calls": [_tool_call(content[k]) for k in at],
    }
    if at != list(range(len(parts), len(content))):
        msg["anthropic"] = {"tool_use_at": at}
    return msg


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
    }
    extra = _extra(block, {"type", "id", "name", "input"})
    if extra:
        call["anthropic"] = extra
    return call


def _user(content: str | list[dict[str, Any]]) -> list[Message]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results, rest = user_blocks(content)
    out = [_tool_message(b) for b in results]
    if not results:
        out.append({"role": "user", "content": list(content)})
    elif rest:
        out.append({"role": "user", "content": rest, "anthropic": {"continues": True}})
    return out


def _tool_message(block: dict[str, Any]) -> Message:
    msg: Message = {
        "role": "tool",
        "tool_call_id": block["tool_use_id"],
        "content": block.get("content", ""),
    }
    marks: dict[str, Any] = {}
    extra = _extra(block, {"type", "tool_use_id", "content"})
    if extra:
        marks["block"] = extra
    if "content" not in block:
        marks["no_content"] = True
    if marks:
        msg["anthropic"] = marks
    return msg


def _extra(block: dict[str, Any], consumed: set[str]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k not in consumed}


# --- OpenAI -> Anthropic ---------------------------------------------------------------------


Sent = Callable[[Sequence[Message], int], tuple[dict[str, Any], int] | None]


def to_anthropic(
    messages: Sequence[Message], *, sent: Sent | None = None
) -> tuple[System, list[dict[str, Any]]]:
    """The Anthropic `(system, messages)` for OpenAI-format messages.

    Leading system/developer messages become `system` (those marked `in_messages` stay
    messages, in place); a run of tool messages becomes one user turn of `tool_result`
    blocks. Raises `InvalidTranscript` for what Anthropic cannot express (an unmarked system
    message after the start, tool arguments that are not a JSON object). `sent(messages, i)`,
    when given, may name the Anthropic message that `messages[i:i + n]` were converted from,
    as `(message, n)`: it is used as it is, unless a run of tool messages goes on past it.
    """
    msgs = validate(messages)
    start = 0
    while start < len(msgs) and _is_parameter(msgs[start]):
        start += 1
    system = _system(msgs[:start])
    out: list[dict[str, Any]] = []
    i = start
    while i < len(msgs):
        known = sent(msgs, i) if sent is not None else None
        if known is not None and not _tool_turn_goes_on(msgs, i + known[1]):
            out.append(known[0])
            i += known[1]
        elif msgs[i]["role"] == "tool":
            i = _tool_turn(msgs, i, out)
        else:
            out.append(_message(msgs[i], i))
            i += 1
    return system, out


def _tool_turn_goes_on(msgs: Sequence[Message], end: int) -> bool:
    """Whether `msgs[end]` would join a tool turn ending at `end` (its results' user turn)."""
    if end == 0 or end >= len(msgs) or msgs[end - 1]["role"] != "tool":
        return False
    return msgs[end]["role"] == "tool" or (
        msgs[end]["role"] == "user" and bool(_marks(msgs[end]).get("continues"))
    )


def _message(m: Message, i: int) -> dict[str, Any]:
    role = m["role"]
    if role in HEAD_ROLES:
        if not _marks(m).get("in_messages"):
            raise InvalidTranscript(f"a {role} message after the start has no Anthropic form", i)
        return {"role": "system", "content": _content(m["content"], i)}
    if role == "assistant":
        return {"role": "assistant", "content": _assistant_content(m, i)}
    return {"role": "user", "content": _content(m["content"], i)}


def _is_parameter(m: Message) -> bool:
    """Whether `m` is (part of) the `system` parameter: a leading system/developer message
    that did not come from among the Anthropic messages."""
    return m["role"] in HEAD_ROLES and not _marks(m).get("in_messages")


def _system(head: Sequence[Message]) -> System:
    if not head:
        return None
    if len(head) == 1:
        return _content(head[0]["content"], 0)
    blocks: list[dict[str, Any]] = []
    for k, m in enumerate(head):
        content = _content(m["content"], k)
        blocks.extend([{"type": "text", "text": content}] if isinstance(content, str) else content)
    return blocks


def _tool_turn(msgs: Sequence[Message], i: int, out: list[dict[str, Any]]) -> int:
    blocks: list[dict[str, Any]] = []
    while i < len(msgs) and msgs[i]["role"] == "tool":
        blocks.append(_tool_result(msgs[i], i))
        i += 1
    if i < len(msgs) and msgs[i]["role"] == "user" and _marks(msgs[i]).get("continues"):
        rest = _content(msgs[i]["content"], i)
        blocks.extend([{"type": "text", "text": rest}] if isinstance(rest, str) else rest)
        i += 1
    out.append({"role": "user", "content": blocks})
    return i


def _tool_result(m: Message, i: int) -> dict[str, Any]:
    marks = _marks(m)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m["tool_call_id"]}
    content = m.get("content")
    if not (marks.get("no_content") and content == ""):
        block["content"] = _content(content, i)
    block.update(marks.get("block") or {})
    return block


def _assistant_content(m: Message, i: int) -> str | list[dict[str, Any]]:
    content = m.get("content")
    calls = m.get("tool_calls") or []
    if not calls:
        if not content and isinstance(m.get("refusal"), str):
            # An OpenAI refusal has null content; Anthropic refuses an empty assistant turn.
            return str(m["refusal"])
        return _content(content if content is not None else "", i)
    if content is None or content == "":
        parts: list[dict[str, Any]] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = [_block(p, i) for p in content]
    uses = [_tool_use(c, i) for c in calls]
    return _interleave(parts, uses, _marks(m).get("tool_use_at"))


def _interleave(
    parts: list[dict[str, Any]], uses: list[dict[str, Any]], at: Any
) -> list[dict[str, Any]]:
    n = len(parts) + len(uses)
    valid = (
        isinstance(at, list)
        and len(at) == len(uses)
        and all(isinstance(k, int) and 0 <= k < n for k in at)
        and at == sorted(set(at))
    )
    if not valid:
        return parts + uses
    out: list[dict[str, Any]] = []
    rest, used = iter(parts), iter(uses)
    out.extend(next(used) if k in at else next(rest) for k in range(n))
    return out


def _tool_use(call: dict[str, Any], i: int) -> dict[str, Any]:
    fn = call["function"]
    args = fn.get("arguments", "")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise InvalidTranscript(
                f"tool call {call['id']!r}: arguments are not valid JSON", i
            ) from None
    if not isinstance(args, dict):
        raise InvalidTranscript(f"tool call {call['id']!r}: arguments are not a JSON object", i)
    block = {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args}
    block.update(call.get("anthropic") or {})
    return block


def _content(content: Any, i: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [_block(p, i) for p in content]


def _block(part: dict[str, Any], i: int) -> dict[str, Any]:
    kind = part["type"]
    if kind == "text" or kind in OPAQUE_BLOCKS:
        return part
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "image_url":
        return _image(part, i)
    raise InvalidTranscript(f"content part type {kind!r} has no Anthropic form", i)


def _image(part: dict[str, Any], i: int) -> dict[str, Any]:
    url = (part.get("image_url") or {}).get("url")
    if not isinstance(url, str):
        raise InvalidTranscript("image_url part needs a string 'url'", i)
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "image", "source": source}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _marks(m: Message) -> dict[str, Any]:
    marks = m.get("anthropic")
    return marks if isinstance(marks, dict) else {}


# --- tool specs ------------------------------------------------------------------------------


def tools_from_anthropic(tools: Sequence[dict[str, Any]]) -> list[ToolSpec]:
    """OpenAI function tool specs for Anthropic tool definitions (extra keys kept)."""
    out: list[ToolSpec] = []
    for k, tool in enumerate(tools):
        check_tool_spec(tool, k)
        fn: dict[str, Any] = {"name": tool["name"]}
        if "description" in tool:
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        spec: ToolSpec = {"type": "function", "function": fn}
        extra = _extra(tool, {"name", "description", "input_schema"})
        if extra:
            spec["anthropic"] = extra
        out.append(spec)
    return out


def tools_to_anthropic(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Anthropic tool definitions for OpenAI function tool specs."""
    out: list[dict[str, Any]] = []
    for k, spec in enumerate(tools):
        fn = spec.get("function") if isinstance(spec, dict) else None
        if spec.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidTranscript(f"tool {k}: only function tools have an Anthropic form")
        if not isinstance(fn.get("name"), str):
            raise InvalidTranscript(f"tool {k}: function needs a string 'name'")
        tool: dict[str, Any] = {"name": fn["name"]}
        if "description" in fn:
            tool["description"] = fn["description"]
        tool["input_schema"] = fn.get("parameters") or {"type": "object", "properties": {}}
        tool.update(spec.get("anthropic") or {})
        out.append(tool)
    return out
