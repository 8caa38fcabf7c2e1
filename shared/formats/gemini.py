"""Gemini API `contents` <-> the OpenAI chat format prefit works in, losslessly.

`to_gemini(from_gemini(system, contents)) == contents` for every valid request: what prefit
does not cut comes back equal, keys in their order. The wire format is the Gemini API's
REST form (camelCase JSON), as the google-genai SDK writes it (`_Content_to_mldev`,
`_Part_to_mldev` in google/genai/models.py) and Gemini CLI sends it through that SDK
(packages/core/src/core/geminiChat.ts). The request's parts map so:

- `systemInstruction` becomes a leading system message (head: never cut) marked `system`,
  which converts back to nothing (the body keeps its own `systemInstruction`);
- a `model` content becomes ONE assistant message, so a model turn is kept or cut whole:
  its `text` parts are text parts, its `functionCall` parts are `tool_calls` (arguments as
  JSON text; an id made from the content's and the part's place when the call has none),
  and every other part (`thought` parts, `executableCode`, types prefit does not know) is
  carried as it came, in place, as a `thinking` part holding its JSON: counted by its size,
  never cut by any strategy, invisible to summaries;
- a `user` content's `functionResponse` parts become tool messages answering the calls of
  the model turn before (by `id` when both have one, else in order, as Gemini pairs them), so
  a model turn and its function responses are one turn group: a turn whose call carries its
  `thoughtSignature` (Gemini 3 refuses a function call whose signature is gone) is kept or
  dropped whole with its responses; its other parts become a user message after them:
  `text` parts as text, `inlineData`, `fileData` and every other part as a `gemini` part
  holding its JSON (a non-text part: counted flat, as an image is).

A part's keys besides its text, call arguments or response (`thoughtSignature`,
`videoMetadata`, a call's `id`, ...) are kept under a `"gemini"` key as JSON text (the
store keeps messages as canonical, key-sorted JSON; a string keeps the key order through
it), with the content's own keys, its place in `contents` (`at`: the messages of one
content convert back to one content) and the order of its parts (`layout`). Strategies
rewrite only text, so a shortened tool output or message converts back as it now is, with
every other key as sent. A message prefit adds (a summary) converts to a `user` content.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from shared.errors import InvalidTranscript
from shared.messages import Message

__all__ = ["GEMINI_MARK", "from_gemini", "gemini_tools", "read_gemini", "to_gemini"]

GEMINI_MARK = "gemini"
_OPAQUE = "thinking"  # a model part carried whole (see the module docstring)
_PART = "gemini"  # a user part carried whole
_TEXT, _CALL, _RESPONSE, _OTHER = "t", "c", "r", "o"  # layout entries


# --- Gemini -> chat -------------------------------------------------------------------------


def from_gemini(system: Any, contents: Any) -> list[Message]:
    """Chat-format messages for a Gemini request's `systemInstruction` and `contents`."""
    return read_gemini(system, contents)[0]


def read_gemini(system: Any, contents: Any) -> tuple[list[Message], list[int]]:
    """The messages, and for each the index of the content it came from (-1 for the system
    instruction); `InvalidTranscript` naming the content at fault."""
    out: list[Message] = []
    origins: list[int] = []
    if system is not None:
        out.append(_system(system))
        origins.append(-1)
    if not isinstance(contents, list):
        raise InvalidTranscript(f"'contents' must be a list, got {_kind(contents)}")
    calls: list[tuple[str, str | None]] = []  # the last model turn's calls not answered yet
    for i, content in enumerate(contents):
        parts = _content_parts(content, i)
        if content.get("role") == "model":
            message, calls = _model(content, parts, i)
            converted = [message]
        else:
            converted = _user(content, parts, i, calls)
        out.extend(converted)
        origins.extend([i] * len(converted))
    return out, origins


def _system(system: Any) -> Message:
    if isinstance(system, str):  # the SDK sends a Content; the REST API takes a string too
        parts: list[Any] = [{"text": system}]
    elif isinstance(system, dict) and isinstance(system.get("parts"), list):
        parts = system["parts"]
    else:
        raise InvalidTranscript("'systemInstruction' must be a content with a list of 'parts'")
    content = [_user_part(p) for p in parts if isinstance(p, dict)]
    return {"role": "system", "content": content, GEMINI_MARK: {"system": True}}


def _content_parts(content: Any, i: int) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise InvalidTranscript(f"content must be an object, got {_kind(content)}", i)
    role = content.get("role", "user")
    if role not in ("user", "model", "function"):
        raise InvalidTranscript(f"content role must be 'user' or 'model', got {role!r}", i)
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise InvalidTranscript("content needs a list of 'parts'", i)
    for k, part in enumerate(parts):
        if not isinstance(part, dict):
            raise InvalidTranscript(f"part {k} must be an object, got {_kind(part)}", i)
    return parts


def _marks(content: dict[str, Any], i: int, layout: list[Any]) -> dict[str, Any]:
    marks: dict[str, Any] = {"at": i, "layout": layout}
    if list(content) != ["role", "parts"] or content["role"] == "function":
        marks["content"] = _dumps({**content, "parts": None})
    return marks


def _model(
    content: dict[str, Any], parts: list[dict[str, Any]], i: int
) -> tuple[Message, list[tuple[str, str | None]]]:
    """The assistant message of a model content, and its calls (id, the call's own id)."""
    shown: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    layout: list[Any] = []
    for k, part in enumerate(parts):
        call = part.get("functionCall")
        if isinstance(call, dict) and not part.get("thought"):
            tool_calls.append(_tool_call(part, call, i, k))
            layout.append(_CALL)
        elif _plain_text(part):
            shown.append({"type": "text", "text": part["text"]})
            layout.append(_TEXT if len(part) == 1 else [_TEXT, _dumps({**part, "text": None})])
        else:
            shown.append({"type": _OPAQUE, _OPAQUE: _dumps(part)})
            layout.append(_OTHER)
    message: Message = {"role": "assistant", "content": shown if shown or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    message[GEMINI_MARK] = _marks(content, i, layout)
    own = [(c["id"], c[GEMINI_MARK]["id"]) for c in tool_calls]
    return message, own


def _plain_text(part: dict[str, Any]) -> bool:
    return isinstance(part.get("text"), str) and not part.get("thought")


def _tool_call(part: dict[str, Any], call: dict[str, Any], i: int, k: int) -> dict[str, Any]:
    name, args = call.get("name"), call.get("args", {})
    if not isinstance(name, str) or not name:
        raise InvalidTranscript(f"functionCall of part {k} needs a non-empty string 'name'", i)
    if not isinstance(args, dict):
        raise InvalidTranscript(f"functionCall of part {k}: 'args' must be an object", i)
    given = call.get("id")
    own = given if isinstance(given, str) and given else None
    shell = {**part, "functionCall": {**call, "args": None}}
    return {
        "id": own or f"gemini_{i}_{k}",
        "type": "function",
        "function": {"name": name, "arguments": _dumps(args)},
        GEMINI_MARK: {"part": _dumps(shell), "args": "args" in call, "id": own},
    }


def _user(
    content: dict[str, Any],
    parts: list[dict[str, Any]],
    i: int,
    calls: list[tuple[str, str | None]],
) -> list[Message]:
    out: list[Message] = []
    shown: list[dict[str, Any]] = []
    layout: list[Any] = []
    for k, part in enumerate(parts):
        response = part.get("functionResponse")
        if isinstance(response, dict):
            out.append(_tool_message(part, response, _answered(calls, response, i, k), i))
            layout.append(_RESPONSE)
        elif _plain_text(part):
            shown.append({"type": "text", "text": part["text"]})
            layout.append(_TEXT if len(part) == 1 else [_TEXT, _dumps({**part, "text": None})])
        else:
            shown.append(_user_part(part))
            layout.append(_OTHER)
    marks = _marks(content, i, layout)
    if shown or not out:
        out.append({"role": "user", "content": shown, GEMINI_MARK: marks})
    else:  # only responses: the first keeps the content's own keys and order
        out[0][GEMINI_MARK] = {**out[0][GEMINI_MARK], **marks}
    return out


def _user_part(part: dict[str, Any]) -> dict[str, Any]:
    if _plain_text(part) and len(part) == 1:
        return {"type": "text", "text": part["text"]}
    return {"type": _PART, _PART: _dumps(part)}


def _answered(calls: list[tuple[str, str | None]], response: dict[str, Any], i: int, k: int) -> str:
    """The id of the call `response` answers (taken off `calls`)."""
    given = response.get("id")
    for n, (_, own) in enumerate(calls):
        if own is not None and own == given:
            return calls.pop(n)[0]
    if not calls:
        raise InvalidTranscript(f"functionResponse of part {k} answers no functionCall", i)
    return calls.pop(0)[0]


def _tool_message(part: dict[str, Any], response: dict[str, Any], call_id: str, i: int) -> Message:
    value = response.get("response")
    key: str | None = None
    if isinstance(value, dict) and len(value) == 1:
        only = next(iter(value))
        if isinstance(value[only], str):
            key = only
    text = value[key] if isinstance(value, dict) and key is not None else _dumps(value)
    if value is None:
        text = ""
    shell = {**part, "functionResponse": {**response, "response": None}}
    marks = {"at": i, "part": _dumps(shell), "key": key, "given": "response" in response}
    return {"role": "tool", "tool_call_id": call_id, "content": text, GEMINI_MARK: marks}


# --- chat -> Gemini -------------------------------------------------------------------------


def to_gemini(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The `contents` of `messages` (from `from_gemini`, maybe cut; the system instruction
    converts to nothing): the messages of one content become that content again."""
    out: list[dict[str, Any]] = []
    for group in _contents(messages):
        first = group[0]
        if first.get("role") == "system" and _mark(first).get("system"):
            continue
        out.append(_content(group))
    return out


def _contents(messages: Sequence[Message]) -> Iterator[list[Message]]:
    """The runs of messages that came from one content (by `at`; an unmarked one alone)."""
    run: list[Message] = []
    for m in messages:
        at = _mark(m).get("at")
        if run and (at is None or _mark(run[0]).get("at") != at):
            yield run
            run = []
        run.append(m)
    if run:
        yield run


def _content(group: list[Message]) -> dict[str, Any]:
    shell: dict[str, Any] | None = None
    for m in group:
        found = _mark(m).get("content")
        if isinstance(found, str):
            shell = _loads(found)
    role = "model" if group[0].get("role") == "assistant" else "user"
    content: dict[str, Any] = dict(shell) if shell is not None else {"role": role}
    content["parts"] = _model_parts(group[0]) if role == "model" else _user_parts(group)
    return content


def _layout(m: Message) -> list[Any]:
    found = _mark(m).get("layout")
    return found if isinstance(found, list) else []


def _model_parts(m: Message) -> list[dict[str, Any]]:
    shown = _shown(m.get("content"))
    calls = iter([_call_part(c) for c in m.get("tool_calls") or [] if isinstance(c, dict)])
    parts: list[dict[str, Any]] = []
    for entry in _layout(m) or [_TEXT] * len(shown):
        if entry == _CALL:
            parts.extend(_next(calls))
        else:
            parts.extend(_shown_part(entry, shown))
    parts.extend(p for part in shown for p in _restored(part))
    parts.extend(calls)
    return parts


def _user_parts(group: list[Message]) -> list[dict[str, Any]]:
    responses = iter([_response_part(m) for m in group if m.get("role") == "tool"])
    own = [m for m in group if m.get("role") != "tool"]
    shown = [p for m in own for p in _shown(m.get("content"))]
    layout = next((_layout(m) for m in group if _layout(m)), [])
    parts: list[dict[str, Any]] = []
    for entry in layout or [_TEXT] * len(shown):
        if entry == _RESPONSE:
            parts.extend(_next(responses))
        else:
            parts.extend(_shown_part(entry, shown))
    parts.extend(p for part in shown for p in _restored(part))
    parts.extend(responses)
    return parts


def _next(found: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    part = next(found, None)
    return [] if part is None else [part]


def _shown(content: Any) -> list[dict[str, Any]]:
    """A message's content as parts (a string as one text part; cut parts are gone)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [p for p in content or [] if isinstance(p, dict)]


def _shown_part(entry: Any, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The part for layout `entry`, taken off the front of `shown` (none when cut)."""
    if not shown:
        return []
    part = shown.pop(0)
    if isinstance(entry, list) and part.get("type") == "text":
        return [{**_loads(entry[1]), "text": part.get("text", "")}]
    return _restored(part)


def _restored(part: dict[str, Any]) -> list[dict[str, Any]]:
    kind = part.get("type")
    if kind in (_OPAQUE, _PART) and isinstance(part.get(kind), str):
        carried = _loads(part[kind])
        if isinstance(carried, dict):
            return [carried]
    if isinstance(part.get("text"), str):
        return [{"text": part["text"]}]
    return []


def _call_part(call: dict[str, Any]) -> dict[str, Any]:
    fn = _object(call.get("function"))
    marks = _object(call.get(GEMINI_MARK))
    arguments = fn.get("arguments")
    try:
        args = _loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        args = {"arguments": arguments}
    shell = marks.get("part")
    if not isinstance(shell, str):  # a call prefit did not read (none today)
        return {"functionCall": {"name": fn.get("name"), "args": args}}
    part = _loads(shell)
    inner = dict(part["functionCall"])
    if marks.get("args", True):
        inner["args"] = args
    else:
        inner.pop("args", None)
    return {**part, "functionCall": inner}


def _response_part(m: Message) -> dict[str, Any]:
    marks = _mark(m)
    text = m.get("content")
    text = (
        text if isinstance(text, str) else "".join(p["text"] for p in _shown(text) if "text" in p)
    )
    key = marks.get("key")
    value: Any
    if isinstance(key, str):
        value = {key: text}
    elif not marks.get("given", True) and not text:
        value = None
    else:
        try:
            value = _loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            value = {"output": text}
    shell = marks.get("part")
    if not isinstance(shell, str):
        return {"functionResponse": {"name": "", "response": value}}
    part = _loads(shell)
    inner = dict(part["functionResponse"])
    if value is None:
        inner.pop("response", None)
    else:
        inner["response"] = value
    return {**part, "functionResponse": inner}


# --- tools ----------------------------------------------------------------------------------


def gemini_tools(tools: Any) -> list[dict[str, Any]]:
    """A request's `tools` as prefit counts them: each function declaration as a chat tool
    spec, every other tool (`googleSearch`, `codeExecution`, ...) as it came."""
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        decls = tool.get("functionDeclarations")
        rest = {k: v for k, v in tool.items() if k != "functionDeclarations"}
        for decl in decls if isinstance(decls, list) else []:
            if isinstance(decl, dict):
                out.append({"type": "function", "function": decl})
        if rest:
            out.append(rest)
    return out


# --- JSON text --------------------------------------------------------------------------------


def _mark(m: Message) -> dict[str, Any]:
    return _object(m.get(GEMINI_MARK))


def _object(value: Any) -> dict[str, Any]:
    """`value` when it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _dumps(value: Any) -> str:
    """Compact JSON text of `value`, keys in their order (the stdlib's for integers past 64
    bits, which orjson does not write)."""
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str) -> Any:
    """The value of `_dumps`'s text (the stdlib's reading where orjson would round)."""
    value = orjson.loads(text)
    return json.loads(text) if _inexact(value) else value


def _inexact(value: Any) -> bool:
    if isinstance(value, float):
        return abs(value) >= 2**63
    if isinstance(value, dict):
        return any(_inexact(v) for v in value.values())
    if isinstance(value, list):
        return any(_inexact(v) for v in value)
    return False


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
