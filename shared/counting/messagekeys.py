"""Content keys of messages: exactly what a token counter reads, as a hashable tuple.

A key holds the fields a counter reads (role, content, name, tool_call_id, each tool call's
name and arguments, a legacy `function_call` as one such call; a null content's `refusal`
text stands in for it), so equal keys mean equal counts and a mutated message simply gets
a new key. Keys are tuples of the message's own strings: Python caches a string's hash on
the object, so re-keying an unchanged message costs a few dict reads and a tuple, not a
pass over its text (no JSON is built on the hot path).

Key shapes: `(role, content)` for the common plain message; otherwise `(role, content,
name, tool_call_id, calls)` with `content` a str, None or a tuple of `(type, text | None)`
parts (a non-text part's text is None, or the text it carries in the clear: a thinking
block's, a plain-text document's) and `calls` None or a tuple of `(name, arguments_json)`.
A 1-tuple `(text,)` keys a bare text (the tool specs' JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

from shared.errors import InvalidTranscript

Key: TypeAlias = tuple[Any, ...]


class KeyFields(NamedTuple):
    """What a key says about its message: the texts to count and the things counted flat."""

    texts: list[str]
    non_text: int  # content parts that are not text (images, audio, files)
    calls: int  # tool calls
    named: bool  # has a `name`


def message_key(m: Mapping[str, Any]) -> Key:
    """The content key of one message, built for speed: it does not check field types.

    A key whose fields have the wrong types either fails to hash (`TypeError`) or fails in
    `fields`; `checked_key` says precisely what is wrong.
    """
    role = m.get("role")
    content = m.get("content")
    if type(content) is list:
        content = _parts_key(content)
    elif len(m) == 2 and role is not None and content is not None:
        return (role, content)  # exactly the two keys role and content
    elif content is None and type(m.get("refusal")) is str:
        content = m["refusal"]  # a refusal sent back counts as its text
    calls = m.get("tool_calls")
    if calls:
        calls = _calls_key(calls)
    elif m.get("function_call"):
        calls = _checked_calls([{"function": m["function_call"]}])
    return (role, content, m.get("name"), m.get("tool_call_id"), calls or None)


def checked_key(m: Any) -> Key:
    """The key of one message after checking every counted field (slow: for error reports)."""
    if not isinstance(m, Mapping):
        raise InvalidTranscript(f"message must be an object, got {type(m).__name__}")
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str):
        raise InvalidTranscript("'role' must be a string")
    for field in ("name", "tool_call_id"):
        if m.get(field) is not None and not isinstance(m[field], str):
            raise InvalidTranscript(f"{field!r} must be a string")
    if content is not None and not isinstance(content, str):
        content = _parts_key(content)
    elif content is None and type(m.get("refusal")) is str:
        content = m["refusal"]
    calls = _checked_calls(m.get("tool_calls"))
    if not calls and m.get("function_call"):
        calls = _checked_calls([{"function": m["function_call"]}])
    return (role, content, m.get("name"), m.get("tool_call_id"), calls)


def fields(key: Key) -> KeyFields:
    """Decompose a key into what is counted; `InvalidTranscript` if a field has a wrong type."""
    try:
        texts, non_text, calls, named = _unpack(key) if len(key) > 2 else (list(key), 0, 0, False)
    except (TypeError, ValueError):  # a field of a foreign shape (a tuple where text belongs)
        texts = [key]
    if not all(type(t) is str for t in texts):
        raise InvalidTranscript("a counted field (role, content, name, tool call) is not a string")
    return KeyFields(texts, non_text, calls, named)


def _unpack(key: Key) -> tuple[list[str], int, int, bool]:
    role, content, name, call_id, calls = key
    texts = [role]
    non_text = 0
    if isinstance(content, tuple):
        for _kind, text in content:
            if text is None:
                non_text += 1
            else:
                texts.append(text)
    elif content is not None:
        texts.append(content)
    texts.extend(s for s in (name, call_id) if s is not None)
    for fn_name, arguments in calls or ():
        texts += (fn_name, arguments)
    return texts, non_text, len(calls or ()), name is not None


def _calls_key(calls: Any) -> tuple[tuple[str, str], ...] | None:
    """Key of tool calls; a single call with string arguments (the usual case) fast."""
    try:
        if len(calls) == 1:
            fn = calls[0]["function"]
            arguments = fn["arguments"]
            if type(arguments) is str:
                return ((fn["name"], arguments),)
    except (KeyError, TypeError, IndexError):
        pass
    return _checked_calls(calls)


def _parts_key(content: Any) -> tuple[tuple[str, str | None], ...]:
    if not isinstance(content, list):
        raise InvalidTranscript("'content' must be a string, null or a list of parts")
    out: list[tuple[str, str | None]] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidTranscript(f"content part {k} must be an object with a string 'type'")
        if part["type"] != "text":
            out.append((part["type"], _readable(part)))
        elif isinstance(part.get("text"), str):
            out.append(("text", part["text"]))
        else:
            raise InvalidTranscript(f"content part {k} of type 'text' needs a string 'text'")
    return tuple(out)


def _readable(part: dict[str, Any]) -> str | None:
    """The text a non-text part carries in the clear, counted as text: an Anthropic thinking
    block's reasoning, a plain-text document; None for the rest (counted flat)."""
    kind = part["type"]
    if kind == "thinking":
        text = part.get("thinking")
    elif kind == "document":
        source = part.get("source")
        text = (
            source.get("data")
            if isinstance(source, dict) and source.get("type") == "text"
            else None
        )
    else:
        return None
    return text if isinstance(text, str) else None


def _checked_calls(calls: Any) -> tuple[tuple[str, str], ...] | None:
    if not calls:
        return None
    if not isinstance(calls, list):
        raise InvalidTranscript("'tool_calls' must be a list")
    out: list[tuple[str, str]] = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidTranscript(f"tool call {k} needs 'function' with a string 'name'")
        out.append((fn["name"], _arguments(fn.get("arguments"), k)))
    return tuple(out)


def _arguments(arguments: Any, k: int) -> str:
    """Arguments as sent: a string as is, a dict as its canonical JSON, null as empty."""
    if arguments is None or isinstance(arguments, str):
        return arguments or ""
    if isinstance(arguments, dict):
        try:
            return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InvalidTranscript(f"tool call {k}: arguments are not JSON: {exc}") from None
    raise InvalidTranscript(f"tool call {k}: 'arguments' must be a string")
