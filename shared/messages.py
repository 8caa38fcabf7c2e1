"""Messages in OpenAI chat format: validation, turn groups and the head.

A message is a plain dict, as clients already hold it. A *turn group* is atomic for every
strategy: an assistant message with `tool_calls` together with the tool results that answer
it, or any other message on its own. Tool results pair with the assistant message right
before them, by position: real clients reuse tool-call ids within one conversation.

Legacy OpenAI function calling, which OpenAI still accepts, is accepted too: an assistant
message with a `function_call` may be answered by the `role: "function"` message right after
it (its `name` says which function). The two form one turn group, as a tool pair does, so
dropping and summarizing keep them together; truncating and clearing leave `function`
results alone (they only touch `tool` messages), and the last resort cuts a long one as any
other long text. A `function` message anywhere else is refused.

Two facts every strategy reads the same way, defined here once:

- A *request* (`is_request`) is a message a person wrote: a user message holding the
  person's own text or attachments. Not the rest of a tool-result turn (the text Anthropic
  carries after `tool_result` blocks, marked `continues`), nor a message made only of blocks
  a client injects for the model (`INJECTED_TAGS`: Claude Code's `<system-reminder>`, Codex's
  `<environment_context>`...), nor blank text. "The user's latest request" is the last one.
- A *thinking turn* is the part of a turn, from its first assistant message that carries a
  thinking block (`thinks`) to the next request, that a cut keeps or removes whole. With
  extended thinking, Anthropic refuses a request whose final assistant turn (the assistant
  messages since the last request, across their tool results) does not start with its
  thinking block ("messages.N.content.0.type: Expected `thinking` or `redacted_thinking`,
  but found `text`. When `thinking` is enabled, a final `assistant` message must start with
  a thinking block"): a tool loop cut after its first step would start with a later step.
  The message form says it: a request with thinking on carries that block back, or
  Anthropic would refuse the client's own request. Other providers tie items only within
  one message, which a cut never splits: a Responses `reasoning` item to the item after it
  (shared/formats/responses.py puts a turn's items in one assistant message), a Gemini
  `thoughtSignature` to its own part (Gemini's `thought` parts ride as `thinking` parts, so
  its tool loops get the rule all the same). `thinking_turns(msgs)` says which positions
  lie inside a thinking turn, `cut_before(msgs, i)` where the latest cut at or before `i`
  may fall.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from shared.errors import InvalidRequest, InvalidTranscript

Message: TypeAlias = dict[str, Any]
ToolSpec: TypeAlias = dict[str, Any]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
HEAD_ROLES = frozenset({"system", "developer"})
_PLAIN = frozenset({"system", "developer", "user", "assistant"})


def groups(msgs: Sequence[Message], start: int = 0) -> list[tuple[int, int]]:
    """Half-open index ranges of atomic turn groups from `start`; `InvalidTranscript` when a
    message is not an object.

    A turn group is an assistant message with tool calls together with its tool results (or
    with the `function` result right after its legacy `function_call`), or any other message
    on its own.

    - msgs: the messages (not validated here);
    - start: the index to start from (0; an int >= 0, `InvalidRequest` otherwise).
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InvalidRequest(f"start must be an integer >= 0, got {start!r}")
    out: list[tuple[int, int]] = []
    i, n = start, len(msgs)
    try:
        while i < n:
            j = i + 1
            if msgs[i].get("role") == "assistant":
                if msgs[i].get("tool_calls"):
                    while j < n and msgs[j].get("role") == "tool":
                        j += 1
                elif j < n and msgs[i].get("function_call") and msgs[j].get("role") == "function":
                    j += 1
            out.append((i, j))
            i = j
    except AttributeError:
        bad = next(k for k in range(start, n) if not isinstance(msgs[k], dict))
        raise InvalidTranscript(f"message must be an object, got {_kind(msgs[bad])}", bad) from None
    return out


# Blocks clients put into user messages for the model, which the person never wrote:
# Claude Code's reminders, local command output and notifications; Codex's context
# fragments (codex-rs calls them "not user intent": they make no user-turn boundary).
INJECTED_TAGS = frozenset(
    {
        "system-reminder",
        "local-command-caveat",
        "local-command-stdout",
        "local-command-stderr",
        "bash-stdout",
        "bash-stderr",
        "task-notification",
        "user-prompt-submit-hook",
        "environment_context",
        "user_instructions",
        "turn_aborted",
        "subagent_notification",
    }
)
_INJECTED = re.compile(
    r"<(" + "|".join(sorted(map(re.escape, INJECTED_TAGS))) + r")(?:\s[^>]*)?>.*?</\1\s*>", re.S
)
THINKING_PARTS = frozenset({"thinking", "redacted_thinking"})
_NOT_OWN_PARTS = THINKING_PARTS | {"text"}  # a part of any other type is an attachment


def is_request(m: Mapping[str, Any]) -> bool:
    """Whether `m` is a request a person made (see the module docstring): a user message,
    not the rest of a tool-result turn, with text of the person's own (not only
    `INJECTED_TAGS` blocks, not blank) or an attachment (an image, a document, a file)."""
    if m.get("role") != "user":
        return False
    marks = m.get("anthropic")
    if isinstance(marks, dict) and marks.get("continues"):
        return False
    content = m.get("content")
    if isinstance(content, str):
        return _own_text(content)
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind not in _NOT_OWN_PARTS or (kind == "text" and _own_text(str(part.get("text")))):
            return True
    return False


def _own_text(text: str) -> bool:
    """Whether `text` says something besides injected blocks."""
    if "</" in text:  # only then can it hold a block to strip
        text = _INJECTED.sub("", text)
    return bool(text) and not text.isspace()


def thinks(m: Mapping[str, Any]) -> bool:
    """Whether `m` is an assistant message carrying a thinking block (a `thinking` or
    `redacted_thinking` part, not a Responses item carried as one), which opens a thinking
    turn."""
    if m.get("role") != "assistant":
        return False
    content = m.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in THINKING_PARTS and "responses" not in p
        for p in content
    )


def thinking_turns(
    msgs: Sequence[Message], start: int = 0, opened: int = -1
) -> tuple[list[int], int]:
    """For each of `msgs[start:]`, the start of the thinking turn it lies inside, -1 when a
    cut right before it splits none (a turn's own first message included); and the start of
    the turn still open after the last message (-1: none).

    - opened: the start of the thinking turn open at `start` (-1: none), as an earlier call
      on `msgs[:start]` returned it.
    """
    out: list[int] = []
    for i in range(start, len(msgs)):
        m = msgs[i]
        if is_request(m):
            opened = -1
            out.append(-1)
        elif opened < 0 and thinks(m):
            opened = i
            out.append(-1)
        else:
            out.append(opened)
    return out, opened


def cut_before(msgs: Sequence[Message], i: int) -> int:
    """The latest position at or before `i` where a cut splits no thinking turn: `i` itself,
    or the start of the thinking turn `msgs[i]` lies inside (read back to the last request)."""
    if i >= len(msgs) or is_request(msgs[i]):
        return i
    found = i
    for j in range(i - 1, -1, -1):
        m = msgs[j]
        if is_request(m):
            break
        if thinks(m):
            found = j
    return found


def tail_start(starts: Sequence[int], head: int, keep_recent: int) -> int:
    """Start of the protected recent tail: the last `keep_recent` of the turn groups that
    start at `starts` (those after the head, which ends at `head`); `head` if fewer."""
    return starts[-keep_recent] if len(starts) >= keep_recent else head


def text_of(message: Mapping[str, Any]) -> str:
    """The message's text content (text parts joined); empty for null content."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def validate(transcript: Any) -> list[Message]:
    """Check a transcript and return it as a list; raise `InvalidTranscript` on the first fault.

    - transcript: a list or tuple of messages in OpenAI chat format (a list comes back as it
      is, not copied); what is refused: docs/design.md, "Validation".
    """
    if not isinstance(transcript, list | tuple):
        raise InvalidTranscript(f"transcript must be a list of messages, got {_kind(transcript)}")
    msgs = transcript if type(transcript) is list else list(transcript)
    if not msgs:
        raise InvalidTranscript("transcript is empty: there is nothing to send")
    validate_from(msgs, 0, None)
    return msgs


@dataclass(frozen=True, slots=True)
class Open:
    """Tool calls of the last assistant message that called tools, and those not answered.

    Providers require every call of an assistant message to be answered by the tool results
    right after it, once each. Only the calls of the transcript's last turn may still be open
    (the calls are in flight).
    """

    calls: frozenset[str]  # every call id of that message
    left: frozenset[str]  # those not answered yet


def validate_from(msgs: list[Message], start: int, pending: Open | None) -> Open | None:
    """Check `msgs[start:]`, given the calls still open at `start`; return those at the end."""
    for i in range(start, len(msgs)):
        m = msgs[i]
        fast = _fast(m, pending)  # the common shapes, checked in a few C-level operations
        if fast is not _SLOW:
            pending = fast
            continue
        _check_message(m, i)
        if m["role"] == "tool":
            pending = _answer(m, i, pending)
            continue
        if pending is not None and pending.left:
            raise _unanswered(pending, i)
        pending = None
        if m["role"] == "function":
            _check_function_result(msgs, m, i)
        if m["role"] == "assistant" and m.get("tool_calls"):
            pending = _calls(m["tool_calls"], i)
    return pending


_SLOW: Any = object()
_TOOL_KEYS = frozenset({"role", "content", "tool_call_id", "name"})
_CALLER_KEYS = frozenset({"role", "content", "tool_calls"})
_CALL_KEYS = frozenset({"id", "type", "function"})


def _fast(m: Any, pending: Open | None) -> Any:
    """The new open calls after a message of a common, valid shape; `_SLOW` for anything else."""
    if type(m) is not dict:
        return _SLOW
    role, content = m.get("role"), m.get("content")
    if len(m) == 2 and type(content) is str and role in _PLAIN:
        return None if pending is None or not pending.left else _SLOW
    if role == "tool":
        call_id = m.get("tool_call_id")
        ok = type(content) is str and type(call_id) is str and m.keys() <= _TOOL_KEYS
        ok = ok and type(m.get("name", "")) is str
        if ok and pending is not None and call_id in pending.left:
            return Open(pending.calls, pending.left - {call_id})
        return _SLOW
    calls = m.get("tool_calls")
    if role != "assistant" or type(calls) is not list or not calls:
        return _SLOW
    if (pending is not None and pending.left) or not m.keys() <= _CALLER_KEYS:
        return _SLOW
    if content is not None and type(content) is not str:
        return _SLOW
    ids = set()
    for call in calls:
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is not dict or not call.keys() <= _CALL_KEYS or type(fn.get("name")) is not str:
            return _SLOW
        if (
            type(fn.get("arguments", "")) is not str
            or type(call.get("id")) is not str
            or not call["id"]
        ):
            return _SLOW
        ids.add(call["id"])
    if len(ids) < len(calls):
        return _SLOW  # the same id twice in one message: the slow path says so
    frozen = frozenset(ids)
    return Open(frozen, frozen)


def _answer(m: Message, i: int, pending: Open | None) -> Open:
    if pending is None:
        raise InvalidTranscript(
            "tool result does not follow an assistant message with tool_calls", i
        )
    tool_call_id = m.get("tool_call_id")
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise InvalidTranscript("tool message needs a non-empty string 'tool_call_id'", i)
    if tool_call_id in pending.left:
        return Open(pending.calls, pending.left - {tool_call_id})
    if tool_call_id in pending.calls:
        raise InvalidTranscript(
            f"tool_call_id {tool_call_id!r} was already answered (a call gets one result)", i
        )
    raise InvalidTranscript(
        f"tool_call_id {tool_call_id!r} answers no call of the assistant message before it", i
    )


def _check_function_result(msgs: list[Message], m: Message, i: int) -> None:
    """A legacy `function` message must name its function and answer the message before."""
    if not isinstance(m.get("name"), str) or not m["name"]:
        raise InvalidTranscript("function message needs a non-empty string 'name'", i)
    before = msgs[i - 1] if i > 0 else None
    if not (isinstance(before, dict) and before.get("role") == "assistant"):
        before = None
    if before is None or not before.get("function_call"):
        raise InvalidTranscript(
            "function message does not follow an assistant message with function_call", i
        )


def _calls(calls: list[Any], i: int) -> Open:
    ids = [c["id"] for c in calls]
    if len(set(ids)) < len(ids):
        twice = next(x for x in ids if ids.count(x) > 1)
        raise InvalidTranscript(f"tool call id {twice!r} appears twice in one message", i)
    frozen = frozenset(ids)
    return Open(frozen, frozen)


def _unanswered(pending: Open, i: int) -> InvalidTranscript:
    left = ", ".join(repr(c) for c in sorted(pending.left))
    return InvalidTranscript(
        f"tool call(s) {left} were never answered: an assistant message with tool_calls "
        "must be followed by the results of all its calls",
        i,
    )


def _check_message(m: Any, i: int) -> None:
    if not isinstance(m, dict):
        raise InvalidTranscript(f"message must be an object, got {_kind(m)}", i)
    role = m.get("role")
    if role not in ROLES:
        raise InvalidTranscript(
            f"unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})", i
        )
    required = role not in ("assistant", "function") or (
        role == "assistant" and not _speaks_otherwise(m)
    )
    _check_content(m.get("content"), i, required=required)
    if "name" in m and m["name"] is not None and not isinstance(m["name"], str):
        raise InvalidTranscript("'name' must be a string", i)
    if "tool_calls" in m and m["tool_calls"] is not None:
        if role != "assistant":
            raise InvalidTranscript(
                f"'tool_calls' is only valid on assistant messages, not {role}", i
            )
        _check_tool_calls(m["tool_calls"], i)
    if m.get("function_call") is not None:
        _check_function_call(m["function_call"], role, i)


def _check_function_call(call: Any, role: str, i: int) -> None:
    if role != "assistant":
        raise InvalidTranscript(
            f"'function_call' is only valid on assistant messages, not {role}", i
        )
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise InvalidTranscript("'function_call' needs a string 'name'", i)
    if not isinstance(call.get("arguments", ""), str | dict):
        raise InvalidTranscript("function_call: 'arguments' must be a string", i)


def _speaks_otherwise(m: Message) -> bool:
    """Whether an assistant message says something without `content` (which may then be
    null): tool calls, or a refusal, an audio reply or a legacy function call as OpenAI
    returns them, sent back as they came."""
    refusal = m.get("refusal")
    return any(m.get(k) for k in ("tool_calls", "audio", "function_call")) or (
        isinstance(refusal, str) and bool(refusal)
    )


def _check_content(content: Any, i: int, *, required: bool) -> None:
    if content is None:
        if required:
            raise InvalidTranscript("'content' is missing or null", i)
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidTranscript(
            f"'content' must be a string, null or a list of parts, got {_kind(content)}", i
        )
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidTranscript(f"content part {k} must be an object with a string 'type'", i)
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise InvalidTranscript(f"content part {k} of type 'text' needs a string 'text'", i)


def _check_tool_calls(calls: Any, i: int) -> None:
    if not isinstance(calls, list):
        raise InvalidTranscript(f"'tool_calls' must be a list, got {_kind(calls)}", i)
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise InvalidTranscript(f"tool call {k} must be an object", i)
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise InvalidTranscript(f"tool call {k} needs a non-empty string 'id'", i)
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidTranscript(f"tool call {k} needs 'function' with a string 'name'", i)
        args = fn.get("arguments", "")
        if not isinstance(args, str | dict):
            raise InvalidTranscript(f"tool call {k}: 'arguments' must be a string", i)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
