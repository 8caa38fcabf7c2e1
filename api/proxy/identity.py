"""Which stored conversation a proxied request belongs to: the one place that decides it.

In order:

1. `X-Prefit-Conversation: <id>` names it, as given.
2. A session the client names in its own way (`SIGNALS`): Claude Code's
   `X-Claude-Code-Session-Id` header or the session in its `metadata.user_id`; Codex's
   `thread-id`, `session-id` (older: `session_id`, `conversation_id`) headers; opencode's
   `x-session-id` / `x-session-affinity`; a `prompt_cache_key` shaped like a UUID (Codex sets
   it to its conversation's id). The id is `<client>-` + 24 hex digits of BLAKE2b over the
   tenant, the signal and the head's key: two tenants naming the same session never share a
   conversation, and neither do the transcripts one session runs side by side (sub-agents,
   title and summary requests: each has its own system prompt and task).
3. Derived: `auto-` + 24 hex digits of BLAKE2b over the tenant and the head's key.

Not sessions: OpenAI's `user` and `safety_identifier` and Anthropic's plain
`metadata.user_id` name a person, who may hold several sessions at once; a
`prompt_cache_key` that is not a UUID names a cache bucket, which apps share across
sessions on purpose.

The head's key is what every turn of one session resends unchanged: the leading
system/developer messages and the person's task (shared/head.py: past a few-shot template,
so sessions that open the same way with different tasks differ), without what clients move
or renew between turns: `cache_control` markers anywhere, Claude Code's per-request
`x-anthropic-billing-header:` line in its system prompt, and a reminder appended to the
latest request (aider): the task's last text counts up to its first blank line.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from api.schemas import CONVERSATION_ID
from shared.errors import InvalidRequest
from shared.hashing import canonical
from shared.head import head_of
from shared.messages import Message

HEADER = "x-prefit-conversation"
DERIVED_PREFIX = "auto-"
_ID = re.compile(CONVERSATION_ID)

# (header, client) in the order they are read; the client names the id's prefix
SIGNALS: tuple[tuple[str, str], ...] = (
    ("x-claude-code-session-id", "claude"),
    ("thread-id", "codex"),  # a Codex thread: its spawned sub-agents get threads of their own
    ("session-id", "codex"),
    ("session_id", "codex"),
    ("conversation_id", "codex"),
    ("x-session-id", "opencode"),
    ("x-session-affinity", "opencode"),
)
MOVED_KEYS = frozenset({"cache_control"})
_BILLING_LINE = re.compile(r"(?m)^x-anthropic-billing-header:.*\n?")
_UUID = re.compile(r"^[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_CLAUDE_USER = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")
SIGNAL_MAX_CHARS = 512


def conversation_id(
    headers: Mapping[str, str], body: Mapping[str, Any], tenant: str, messages: Sequence[Message]
) -> str:
    """The request's conversation id (see the module docstring for the order)."""
    named = headers.get(HEADER)
    if named is not None:
        if not _ID.match(named):
            raise InvalidRequest(
                f"{HEADER} must be 1-128 characters of [A-Za-z0-9._-], starting with a "
                "letter or digit"
            )
        return named
    signal = session_signal(headers, body)
    if signal is not None:
        client, value = signal
        return f"{client}-{_digest(tenant, client, value, head_key(messages))}"
    return derived_id(tenant, messages)


def derived_id(tenant: str, messages: Sequence[Message]) -> str:
    """`auto-` + 24 hex digits of BLAKE2b over the tenant and the head's key."""
    return DERIVED_PREFIX + _digest(tenant, head_key(messages))


def session_signal(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(client, session) from the first session signal the request carries, else None."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, client in SIGNALS[:1]:  # Claude Code's header, then the session in its body
        found = _usable(lowered.get(name))
        if found:
            return client, found
    claude = claude_session(body.get("metadata"))
    if claude:
        return "claude", claude
    for name, client in SIGNALS[1:]:
        found = _usable(lowered.get(name))
        if found:
            return client, found
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and _UUID.match(key):
        return "codex", key.lower()
    return None


def claude_session(metadata: Any) -> str | None:
    """The session in Claude Code's `metadata.user_id`: `user_<hash>_account_<uuid>_session_
    <uuid>`, or (newer versions) a JSON object string with `session_id`; None for any other
    user id (a person, not a session)."""
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user, str):
        return None
    if user.startswith("{"):
        try:
            parsed = json.loads(user)
        except ValueError:
            return None
        found = parsed.get("session_id") if isinstance(parsed, dict) else None
        return _usable(found if isinstance(found, str) else None)
    match = _CLAUDE_USER.search(user) if user.startswith("user_") else None
    return match.group(1) if match else None


def head_key(messages: Sequence[Message]) -> str:
    """What of the head every turn of one session resends unchanged, hashed (see above)."""
    head = head_of(messages)
    lead = [steady(m) for m in messages[: head.lead]]
    task = _task_key(messages[head.task]) if head.task is not None else None
    return hashlib.blake2b(canonical({"lead": lead, "task": task}), digest_size=16).hexdigest()


def steady(value: Any) -> Any:
    """`value` without what clients move or renew between turns of one session."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in MOVED_KEYS}
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, str) and "x-anthropic-billing-header:" in value:
        return _BILLING_LINE.sub("", value)
    return value


def _task_key(message: Message) -> Any:
    """The task as every turn resends it: its last text up to the first blank line (a client
    may append a reminder to the latest request only)."""
    task = steady(message)
    content = task.get("content")
    if isinstance(content, str):
        return {**task, "content": _first_paragraph(content)}
    if isinstance(content, list):
        texts = [
            i for i, p in enumerate(content) if isinstance(p, dict) and p.get("type") == "text"
        ]
        if texts:
            last = texts[-1]
            part = content[last]
            cut = {**part, "text": _first_paragraph(str(part.get("text", "")))}
            return {**task, "content": [*content[:last], cut, *content[last + 1 :]]}
    return task


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n", 1)[0].rstrip()


def _usable(value: str | None) -> str | None:
    """A signal's value when it says something (not empty, not absurdly long)."""
    if value is None:
        return None
    value = value.strip()
    return value if 0 < len(value) <= SIGNAL_MAX_CHARS else None


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()
