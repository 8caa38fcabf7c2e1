"""Who is calling the proxy, and which stored conversation a request belongs to.

The caller (`identify`), and which provider key goes upstream: SDKs put their key where
their provider wants it, OpenAI's in `Authorization: Bearer`, Anthropic's in `x-api-key`
(newer Anthropic SDKs also use `Authorization: Bearer`), Gemini's in `x-goog-api-key` (or
the `?key=` query, which the route moves into that header, api/proxy/dialects/gemini.py).
Any of them authenticates the prefit tenant, and that key is never sent upstream: the
deployment's key for the provider is (`PREFIT_OPENAI_API_KEY`, `PREFIT_ANTHROPIC_API_KEY`,
`PREFIT_GEMINI_API_KEY`).

Opt-in (`PREFIT_PROXY_FORWARD_CLIENT_KEYS=true`): a client sends its prefit key in
`X-Prefit-Api-Key` and its own provider key where the SDK puts it; that provider header is
then forwarded as it came. In open mode (no prefit keys) the SDK's key is the provider key;
without the opt-in it goes upstream only when the deployment has no key for that provider
(a local `prefit up` in front of the client's own account), never in place of one.

The conversation (`resolved`), decided in this one place. In order:

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
latest request (aider): the task's last text counts up to its first blank line. The head is
found past the tenant's learned preambles (`resolved`: shared/store/openings.py), and of the
two readings of aider's first "I updated the files." / "Ok." (a few-shot close, or a running
note after the task) the one naming a stored conversation is taken.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from api.auth import KeyRing
from api.schemas import CONVERSATION_ID
from shared.errors import InvalidRequest, Unauthorized
from shared.hashing import canonical
from shared.head import Head, head_of, steady, task_key
from shared.messages import Message
from shared.settings import Settings
from shared.store import keys
from shared.store.openings import TIMEOUT_S, AsyncClient, Openings, faults

# --- who is calling -----------------------------------------------------------------------

PREFIT_KEY = "x-prefit-api-key"
PROVIDER_AUTH = ("authorization", "x-api-key", "x-goog-api-key")  # Gemini's: also `?key=`


@dataclass(frozen=True)
class Caller:
    """The tenant, and the client's own provider auth headers to forward (maybe none)."""

    tenant: str
    provider_auth: dict[str, str] = field(default_factory=dict)
    # open mode: the SDK's key headers, for an upstream the deployment has no key for
    fallback_auth: dict[str, str] = field(default_factory=dict)


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def identify(headers: Mapping[str, str], keyring: KeyRing, settings: Settings) -> Caller:
    """The caller of a proxy request; `Unauthorized` when no valid prefit key is given."""
    own = (
        headers.get("x-api-key")
        or headers.get("x-goog-api-key")
        or _bearer(headers.get("authorization"))
    )
    prefit_key = headers.get(PREFIT_KEY)
    if prefit_key is not None:
        tenant = keyring.tenant_for_key(prefit_key)
        provider = own is not None and own.strip() != prefit_key.strip()
    elif keyring.open:
        tenant, provider = keyring.tenant_for_key(""), own is not None
    elif own is None:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>' "
            "(Gemini: 'x-goog-api-key: <key>')"
        )
    else:
        tenant, provider = keyring.tenant_for_key(own), False
    if not provider:
        return Caller(tenant)
    mine = (prefit_key or "").strip()
    auth = {
        h: v
        for h in PROVIDER_AUTH
        if (v := headers.get(h)) is not None and (_bearer(v) or v).strip() != mine
    }
    if settings.proxy_forward_client_keys:
        return Caller(tenant, auth)
    return Caller(tenant, fallback_auth=auth if keyring.open else {})


# --- which conversation -------------------------------------------------------------------

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
_UUID = re.compile(r"^[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_CLAUDE_USER = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")
SIGNAL_MAX_CHARS = 512


def conversation_id(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tenant: str,
    messages: Sequence[Message],
    preambles: frozenset[str] = frozenset(),
) -> str:
    """The request's conversation id (see the module docstring for the order)."""
    return conversation_ids(headers, body, tenant, messages, preambles)[0]


def conversation_ids(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tenant: str,
    messages: Sequence[Message],
    preambles: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """The request's conversation id, then the id of the other reading of its head when
    the transcript alone cannot tell it (`Head.note_task`): the caller takes that one when
    it names a stored conversation (the session's earlier prompts named it)."""
    named = headers.get(HEADER)
    if named is not None:
        if not _ID.match(named):
            raise InvalidRequest(
                f"{HEADER} must be 1-128 characters of [A-Za-z0-9._-], starting with a "
                "letter or digit"
            )
        return (named,)
    head = head_of(messages, preambles=preambles)
    keys = [head_key(messages, preambles, head)]
    if head.note_task is not None:
        keys.append(_key(messages, head.lead, head.note_task))
    signal = session_signal(headers, body)
    if signal is not None:
        client, value = signal
        return tuple(f"{client}-{_digest(tenant, client, value, key)}" for key in keys)
    return tuple(DERIVED_PREFIX + _digest(tenant, key) for key in keys)


async def resolved(
    client: AsyncClient,
    openings: Openings,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tenant: str,
    messages: Sequence[Message],
    guessed: tuple[frozenset[str], tuple[str, ...]] | None = None,
) -> tuple[str, frozenset[str]]:
    """(the request's conversation id, the preambles its head is found past), the tenant's
    memory of openings read (shared/store/openings.py). Of the two readings of an
    unconfirmed few-shot close, the one naming a stored conversation. `guessed`: preambles
    known before the read and the `conversation_ids` they gave, reused when the read agrees."""
    preambles = await openings.preambles(client, tenant, messages)
    if guessed is not None and guessed[0] == preambles:
        ids = guessed[1]
    else:
        ids = conversation_ids(headers, body, tenant, messages, preambles)
    if len(ids) > 1 and await _stored(client, tenant, ids[1]):
        return ids[1], preambles
    return ids[0], preambles


async def _stored(client: AsyncClient, tenant: str, conv_id: str) -> bool:
    """Whether `conv_id` names a stored conversation (False when Redis does not say)."""
    try:
        found = await asyncio.wait_for(client.exists(keys.conv_meta(tenant, conv_id)), TIMEOUT_S)
    except faults():
        return False
    return bool(found)


def derived_id(
    tenant: str, messages: Sequence[Message], preambles: frozenset[str] = frozenset()
) -> str:
    """`auto-` + 24 hex digits of BLAKE2b over the tenant and the head's key (what
    `conversation_id` gives a request that names no conversation or session)."""
    return conversation_ids({}, {}, tenant, messages, preambles)[0]


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


def head_key(
    messages: Sequence[Message], preambles: frozenset[str] = frozenset(), head: Head | None = None
) -> str:
    """What of the head every turn of one session resends unchanged, hashed (see above)."""
    head = head if head is not None else head_of(messages, preambles=preambles)
    return _key(messages, head.lead, head.task)


def _key(messages: Sequence[Message], lead: int, task: int | None) -> str:
    """The head's key with `lead` leading messages and the task at `task`."""
    steady_lead = [steady(m) for m in messages[:lead]]
    key = task_key(messages[task]) if task is not None else None
    return hashlib.blake2b(
        canonical({"lead": steady_lead, "task": key}), digest_size=16
    ).hexdigest()


def _usable(value: str | None) -> str | None:
    """A signal's value when it says something (not empty, not absurdly long)."""
    if value is None:
        return None
    value = value.strip()
    return value if 0 < len(value) <= SIGNAL_MAX_CHARS else None


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()
