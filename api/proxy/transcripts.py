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
"""

from __future__ import annotations

from dataclasses import dataclass

from api.cache import EMPTY_LOADED, Loaded
from api.conversations import Conversations, Sizes
from api.deps import Services
from api.policies import Window
from api.prepare import Preparer
from shared.errors import NotFound
from shared.hashing import canonical, extend_chain, prefix_hashes
from shared.messages import Message, ToolSpec
from shared.summaries.book import SummaryRecord


@dataclass(frozen=True)
class Opened:
    """A request's transcript as the stored prepare sees it once synced."""

    loaded: Loaded
    best: SummaryRecord | None


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
            return Opened(stored, best)
        hashes = extend_chain(stored.hashes[-1], new)
        return Opened(stored.extended(new, [canonical(m) for m in new], hashes), best)
    raw = [canonical(m) for m in messages]
    loaded = Loaded(list(messages), raw, prefix_hashes(messages), sum(map(len, raw)))
    best = await Preparer(svc).record_for(tenant, window, messages, loaded.hashes)
    return Opened(loaded, best)


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
    window: Window,
    tools: list[ToolSpec],
    hashes: list[str] | None = None,
) -> Sizes:
    """Make the stored conversation `conv_id` hold exactly `messages` (sync: threadpool):
    `Conversations.sync`, which appends only what is new when the stored transcript is a
    prefix (compared by prefix hash, atomically), and replaces it otherwise. The transcript
    is validated first: a request forwarded unchecked never stores a malformed one. It is
    the one the request validated as frozen (`Relay._checked`), so that is an identity check."""
    validated = svc.validated.validate_with(messages, None, frozen=True)[0]
    return Conversations(svc).sync(tenant, conv_id, validated, window, tools, hashes=hashes)
