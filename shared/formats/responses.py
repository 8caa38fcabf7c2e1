"""OpenAI Responses API input <-> the OpenAI chat format prefit works in, losslessly.

`to_responses(from_responses(instructions, items)) == items` for every valid input: what
prefit does not cut comes back equal, keys in their order. The Responses items map so:

- `instructions` become a leading system message (head: never cut) marked `instructions`,
  which converts back to nothing (the body keeps its own `instructions`);
- a `message` item (or an item with a `role` and no `type`) of role user, system or
  developer becomes a message of that role; its `input_text` parts become text parts, its
  other parts (images, files, ...) ride along as parts of their own type;
- the assistant's output between two inputs (its messages, `function_call` and
  `custom_tool_call` items, and whatever else the model produced: `reasoning`, server tool
  calls, ...) becomes ONE assistant message: text parts, the calls as `tool_calls`, so a
  turn is kept or cut whole; `layout` records the order of its items;
- `function_call_output` / `custom_tool_call_output` become tool messages answering their
  call by `call_id`, so a call and its output are one turn group;
- every other item (`reasoning` with its `encrypted_content`, `local_shell_call` and its
  output, `computer_call`, `web_search_call`, `mcp_*`, `item_reference`, types prefit does
  not know) is carried as it came, in place, in the assistant message of its turn, as a
  `thinking` part holding its JSON: counted by its size, never cut by any strategy (they
  keep thinking blocks as sent), invisible to summaries. An output item of that kind (a
  `local_shell_call_output`) ends its turn, so a local shell loop is a turn per step; the
  outputs right after it join that turn, and one right after tool messages (beside
  function outputs) rides with the last of them, under the marker: a pair is never split.

What has no chat twin is kept under a `"responses"` key: on a message (`item`: the item less
its content; `layout`; `instructions`; `after`), on a tool call (the call item less its
arguments) and on a text part (the part less its text). Those items are kept as JSON text,
as the carried items are: the store keeps messages as canonical (key-sorted) JSON, and a
string keeps an item's key order through it. Strategies rewrite only text, so a
shortened tool output or message converts back as it now is, with every other key as sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from shared.errors import InvalidTranscript
from shared.messages import Message

__all__ = ["MARK", "from_responses", "read_responses", "to_responses"]

MARK = "responses"
CALLS = {"function_call": "arguments", "custom_tool_call": "input"}  # the call's payload key
OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
INPUT_ROLES = frozenset({"user", "system", "developer"})
_OPAQUE = "thinking"  # the part type carrying an opaque item (see the module docstring)
_CALL, _ITEM = "call", "item"  # layout entries besides a message's {"parts": n, ...}


# --- Responses -> chat -----------------------------------------------------------------------


def from_responses(instructions: Any, items: Any) -> list[Message]:
    """Chat-format messages for a Responses request's `instructions` and `input`."""
    return read_responses(instructions, items)[0]


def read_responses(instructions: Any, items: Any) -> tuple[list[Message], list[int]]:
    """The messages, and for each the index of the `input` item it starts at (-1 for the
    instructions); `InvalidTranscript` naming the item at fault."""
    out: list[Message] = []
    origins: list[int] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidTranscript("'instructions' must be a string")
        out.append({"role": "system", "content": instructions, MARK: {"instructions": True}})
        origins.append(-1)
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}], [*origins, 0]
    if not isinstance(items, list):
        raise InvalidTranscript(f"'input' must be a string or a list of items, got {_kind(items)}")
    reader = _Reader(out, origins)
    for i, item in enumerate(items):
        reader.read(item, i)
    return out, origins


class _Reader:
    """Appends the messages of one item after another; `run` is the assistant message still
    open (no output or input since it began)."""

    def __init__(self, out: list[Message], origins: list[int]) -> None:
        self.out = out
        self.origins = origins
        self.run: Message | None = None
        self.answered: Message | None = None  # the last turn an output item closed

    def read(self, item: Any, i: int) -> None:
        if not isinstance(item, dict):
            raise InvalidTranscript(f"item must be an object, got {_kind(item)}", i)
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            self._message(item, i)
        elif kind in CALLS:
            self._call(item, kind, i)
        elif kind in OUTPUTS:
            self._output(item, i)
        else:
            self._opaque(item, i)

    def _message(self, item: dict[str, Any], i: int) -> None:
        role = item.get("role")
        content = item.get("content")
        if not isinstance(content, str | list):
            raise InvalidTranscript(
                f"message 'content' must be a string or a list of parts, got {_kind(content)}", i
            )
        if role == "assistant":
            parts = _parts(content, "output_text", i)
            entry: dict[str, Any] = {"parts": -1 if isinstance(content, str) else len(parts)}
            if not _plain(item, content):
                entry["item"] = _shell(item, "content")
            run = self._open(i)
            run["content"].extend(parts)
            run[MARK]["layout"].append(entry)
            return
        if role not in INPUT_ROLES:
            raise InvalidTranscript(
                f"message role must be user, assistant, system or developer, got {role!r}", i
            )
        msg: Message = {
            "role": role,
            "content": content if isinstance(content, str) else _parts(content, "input_text", i),
        }
        if not _plain(item, content):
            msg[MARK] = {"item": _shell(item, "content")}
        self._append(msg, i)

    def _call(self, item: dict[str, Any], kind: str, i: int) -> None:
        payload = CALLS[kind]
        call_id, name, args = item.get("call_id"), item.get("name"), item.get(payload)
        if not isinstance(call_id, str) or not call_id:
            raise InvalidTranscript(f"{kind} needs a non-empty string 'call_id'", i)
        if not isinstance(name, str) or not isinstance(args, str):
            raise InvalidTranscript(f"{kind} needs string 'name' and {payload!r}", i)
        run = self._open(i)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        call[MARK] = _shell(item, payload)
        run.setdefault("tool_calls", []).append(call)
        run[MARK]["layout"].append(_CALL)

    def _output(self, item: dict[str, Any], i: int) -> None:
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidTranscript(f"{item['type']} needs a non-empty string 'call_id'", i)
        if not isinstance(output, str | list):
            raise InvalidTranscript(
                f"{item['type']} 'output' must be a string or a list of parts", i
            )
        content = output if isinstance(output, str) else _parts(output, "input_text", i)
        msg: Message = {"role": "tool", "tool_call_id": call_id, "content": content}
        msg[MARK] = {"item": _shell(item, "output")}
        self._append(msg, i)

    def _opaque(self, item: dict[str, Any], i: int) -> None:
        kind = item.get("type")
        output = isinstance(kind, str) and kind.endswith("_output")
        last = self.out[-1] if self.out else None
        if output and self.run is None and last is not None:
            if last["role"] == "tool":  # beside function outputs: rides with them
                last[MARK].setdefault("after", []).append(_dumps(item))
                return
            if last is self.answered:  # another output of the turn one output closed
                _carry(last, item)
                return
        run = self._open(i)
        _carry(run, item)
        if output and "tool_calls" not in run:  # its output ends the turn (a local shell
            self.run, self.answered = None, run  # loop is one turn per step, not one turn)

    def _open(self, i: int) -> Message:
        """The open assistant message, begun at item `i` when there is none."""
        if self.run is None:
            self.run = {"role": "assistant", "content": [], MARK: {"layout": []}}
            self.out.append(self.run)
            self.origins.append(i)
        return self.run

    def _append(self, msg: Message, i: int) -> None:
        self.run = None
        self.out.append(msg)
        self.origins.append(i)


def _shell(item: dict[str, Any], key: str) -> str:
    """`item` less its `key`'s value, as JSON text: a string keeps the item's key order
    through the store, which keeps messages as canonical (key-sorted) JSON."""
    return _dumps({**item, key: None})


def _unshell(shell: Any) -> dict[str, Any] | None:
    """The item of a `_shell` (None for what is not one)."""
    if not isinstance(shell, str):
        return None
    item = _loads(shell)
    return item if isinstance(item, dict) else None


def _dumps(value: Any) -> str:
    """Compact JSON text of `value`: orjson's (ten times the stdlib's speed), the stdlib's
    for integers past 64 bits, which orjson does not write."""
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str) -> Any:
    """The value of `_dumps`'s text: orjson's reading, or the stdlib's where orjson read an
    integer past 64 bits (as a float)."""
    value = orjson.loads(text)
    return value if not _inexact(value) else json.loads(text)


def _inexact(value: Any) -> bool:
    """Whether orjson read a float where a very large integer may have stood."""
    if isinstance(value, float):
        return abs(value) >= 2**63
    if isinstance(value, dict):
        return any(_inexact(v) for v in value.values())
    if isinstance(value, list):
        return any(_inexact(v) for v in value)
    return False


def _carry(run: Message, item: dict[str, Any]) -> None:
    """Put `item` at the end of assistant message `run`, as a part holding its JSON."""
    run["content"].append({"type": _OPAQUE, _OPAQUE: _dumps(item), MARK: _ITEM})
    run[MARK]["layout"].append(_ITEM)


def _plain(item: dict[str, Any], content: Any) -> bool:
    """Whether `item` is an easy message `{role, content}` with string content."""
    return isinstance(content, str) and item.keys() == {"role", "content"}


def _parts(content: str | list[Any], text_type: str, i: int) -> list[dict[str, Any]]:
    """Chat content parts for Responses content; `text_type` is the default text part type."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidTranscript(f"content part {k} must be an object with a string 'type'", i)
        if part["type"] in ("input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise InvalidTranscript(f"content part {k} needs a string 'text'", i)
            text: dict[str, Any] = {"type": "text", "text": part["text"]}
            if part != {"type": text_type, "text": part["text"]}:
                text[MARK] = _shell(part, "text")
            out.append(text)
        elif part["type"] in ("text", _OPAQUE):  # would be read as prefit's own: not carried
            raise InvalidTranscript(f"content part {k}: unknown type {part['type']!r}", i)
        else:
            out.append(part)
    return out


# --- chat -> Responses -----------------------------------------------------------------------


def to_responses(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The Responses `input` items for chat-format messages (the instructions left out)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        marks = _marks(m)
        if marks.get("instructions"):
            continue
        role = m.get("role")
        if role == "assistant":
            out.extend(_run_items(m, marks))
        elif role == "tool":
            out.append(_output_item(m, marks))
            out.extend(_loads(text) for text in marks.get("after") or [])
        else:
            out.append(_input_message(m, marks))
    return out


def _input_message(m: Message, marks: dict[str, Any]) -> dict[str, Any]:
    content = _restored(m.get("content"), "input_text")
    shell = _unshell(marks.get("item"))
    if shell is not None:
        return {**shell, "content": content}
    return {"role": m["role"], "content": content}


def _output_item(m: Message, marks: dict[str, Any]) -> dict[str, Any]:
    output = _restored(m.get("content"), "input_text")
    shell = _unshell(marks.get("item"))
    if shell is not None:
        return {**shell, "output": output}
    return {"type": "function_call_output", "call_id": m["tool_call_id"], "output": output}


def _run_items(m: Message, marks: dict[str, Any]) -> list[dict[str, Any]]:
    """The items of one assistant message, in the order its layout records."""
    content = m.get("content")
    if isinstance(content, str):
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    else:
        parts = list(content or [])
    calls = list(m.get("tool_calls") or [])
    layout = marks.get("layout")
    if isinstance(layout, list) and _consumes(layout) == (len(parts), len(calls)):
        return _laid_out(layout, iter(parts), iter(calls))
    if not marks and isinstance(content, str) and not calls:
        return [{"role": "assistant", "content": content}]
    return _in_order(parts) + [_call_item(c) for c in calls]


def _consumes(layout: list[Any]) -> tuple[int, int]:
    """How many parts and calls a layout takes."""
    parts = calls = 0
    for entry in layout:
        if entry == _CALL:
            calls += 1
        elif entry == _ITEM:
            parts += 1
        elif isinstance(entry, dict) and isinstance(entry.get("parts"), int):
            parts += 1 if entry["parts"] < 0 else entry["parts"]  # -1: string content
        else:
            return -1, -1
    return parts, calls


def _laid_out(
    layout: list[Any], parts: Iterator[dict[str, Any]], calls: Iterator[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for entry in layout:
        if entry == _CALL:
            out.append(_call_item(next(calls)))
        elif entry == _ITEM:
            out.append(_item_of(next(parts)))
        elif entry["parts"] < 0:  # string content, one text part
            part = next(parts)
            text = part.get("text") if part.get("type") == "text" else None
            content: Any = text if isinstance(text, str) else _restored([part], "output_text")
            out.append(_assistant_message(entry, content))
        else:
            mine = [next(parts) for _ in range(entry["parts"])]
            out.append(_assistant_message(entry, _restored(mine, "output_text")))
    return out


def _assistant_message(entry: dict[str, Any], content: Any) -> dict[str, Any]:
    shell = _unshell(entry.get("item"))
    if shell is not None:
        return {**shell, "content": content}
    return {"role": "assistant", "content": content}


def _in_order(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items for content parts with no usable layout: each carried item as it is, each run
    of other parts as one assistant message."""
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for part in parts:
        if _is_item(part):
            if pending:
                out.append(_new_assistant(pending))
                pending = []
            out.append(_item_of(part))
        else:
            pending.append(part)
    if pending:
        out.append(_new_assistant(pending))
    return out


def _new_assistant(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": _restored(parts, "output_text")}


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    shell = _unshell(call.get(MARK))
    if shell is not None:
        payload = CALLS.get(str(shell.get("type")), "arguments")
        return {**shell, payload: fn.get("arguments", "")}
    return {
        "type": "function_call",
        "call_id": call["id"],
        "name": fn.get("name"),
        "arguments": fn.get("arguments", ""),
    }


def _is_item(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == _OPAQUE and part.get(MARK) == _ITEM


def _item_of(part: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = _loads(part[_OPAQUE])
    return item


def _restored(content: Any, text_type: str) -> Any:
    """Responses content for chat content: a string as it is, text parts back to their type."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out: list[Any] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            shell = _unshell(part.get(MARK))
            base = shell if shell is not None else {"type": text_type}
            out.append({**base, "text": part.get("text", "")})
        else:
            out.append(part)
    return out


def _marks(m: Message) -> dict[str, Any]:
    marks = m.get(MARK)
    return marks if isinstance(marks, dict) else {}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
