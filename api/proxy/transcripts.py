"""A proxied request's transcript against the stored conversation: open it, sync it.

Clients resend the whole transcript each turn, so the stored one is almost always a prefix
of it. `open_conversation` reads the stored transcript (from the API's cache, asking Redis
only for what the cache lacks) and compares it with the request's (C-level list equality):
when it is a prefix, the request's transcript is the stored one plus the new messages, with
the stored prefix hashes extended by those only, and the stored conversation's best summary
record applies to it. Otherwise (a new conversation, an edit, a regeneration) the prefix
hashes are computed afresh and the tenant's longest record for a prefix of it is looked up.

`sync` then makes the store hold exactly the request's transcript: it runs after the answer,
off the request's path, since the fit already works on the transcript as it will be stored.
A request that was fitted without reading the store (under the trigger) learns how much of
it is stored with `stored_prefix`, after the answer too.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.cache import EMPTY_LOADED, Loaded
from api.conversations import Conversations, Sizes
from api.deps import Services
from api.policies import Window
from api.prepare import Preparer
from api.schemas import AppendRequest, ReplaceRequest
from shared.errors import LengthMismatch, NotFound
from shared.hashing import canonical, extend_chain, prefix_hashes
from shared.messages import Message, ToolSpec
from shared.summaries import SummaryRecord

SYNC_ATTEMPTS = 3  # appends tried before a sync falls back on replacing the transcript


@dataclass(frozen=True)
class Opened:
    """A request's transcript as the stored prepare sees it once synced.

    `stored_length`: how many of its first messages the store already holds (only the rest
    need appending); None when the stored transcript is not a prefix and must be replaced.
    """

    loaded: Loaded
    best: SummaryRecord | None
    stored_length: int | None


async def open_conversation(
    svc: Services, tenant: str, conv_id: str, messages: list[Message], window: Window
) -> Opened:
    """`messages` against the stored conversation `conv_id` (`StoreUnavailable` without Redis)."""
    try:
        stored, best = await svc.cache.aload(tenant, conv_id, svc.increments())
    except NotFound:
        stored, best = EMPTY_LOADED, None
    k = stored.length
    if _extends(messages, stored):
        new = messages[k:]
        if not new:
            return Opened(stored, best, k)
        hashes = extend_chain(stored.hashes[-1], new)
        return Opened(stored.extended(new, [canonical(m) for m in new], hashes), best, k)
    raw = [canonical(m) for m in messages]
    loaded = Loaded(list(messages), raw, prefix_hashes(messages), sum(map(len, raw)))
    best = await Preparer(svc).record_for(tenant, window, messages, loaded.hashes)
    return Opened(loaded, best, 0 if k == 0 else None)


def stored_prefix(svc: Services, tenant: str, conv_id: str, messages: list[Message]) -> int | None:
    """How many first messages of `messages` the store holds as `conv_id` (0: none, it does
    not exist); None when the stored transcript is not a prefix (sync: threadpool)."""
    try:
        stored, _ = svc.cache.load(tenant, conv_id)
    except NotFound:
        return 0
    return stored.length if _extends(messages, stored) else None


def _extends(messages: list[Message], stored: Loaded) -> bool:
    """Whether `messages` begin with the (non-empty) stored transcript: C-level equality."""
    k = stored.length
    return bool(k) and k <= len(messages) and messages[:k] == stored.messages


def sync(
    svc: Services,
    tenant: str,
    conv_id: str,
    messages: list[Message],
    *,
    stored_length: int | None,
    window: Window,
    tools: list[ToolSpec],
) -> Sizes | None:
    """Make the stored conversation `conv_id` hold exactly `messages` (sync: threadpool).

    O(new) when the store holds `messages[:stored_length]`: only the rest is appended, stating
    that length. When the store moved since `stored_length` was read (the previous turn's
    sync landed in between, the common case), it is read again and what is still missing is
    appended; when the stored transcript is not a prefix (`stored_length` None, an edit), or
    writers keep racing, `messages` replace it. None when nothing needed writing.
    """
    conversations = Conversations(svc)
    known = stored_length
    for _ in range(SYNC_ATTEMPTS):
        if known is None:
            break
        new = messages[known:]
        if not new:
            return None
        append = AppendRequest(
            messages=new, model=window.model, expected_length=known, tools=tools or None
        )
        try:
            return conversations.append(tenant, conv_id, append, window)
        except LengthMismatch:
            known = stored_prefix(svc, tenant, conv_id, messages)
    replace = ReplaceRequest(messages=messages, model=window.model, tools=tools or None)
    return conversations.replace(tenant, conv_id, replace, window)
