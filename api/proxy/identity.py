"""Which stored conversation a proxied request belongs to.

`X-Prefit-Conversation: <id>` names it. Without that header the id is derived from the
tenant and the content hash of the transcript's head (system prompt and first user message:
what every turn of one conversation resends unchanged), so a client that sends nothing extra
still has its conversation stored, and summarized ahead of time, across turns. Two
conversations of one tenant with the same head share a derived id: each request still gets
its own transcript fitted (the store is synced to it), but they replace each other in the
store and lose their summaries; such clients should name their conversations.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from api.schemas import CONVERSATION_ID
from shared.errors import InvalidRequest
from shared.hashing import prefix_hash
from shared.head import head_end
from shared.messages import Message

HEADER = "x-prefit-conversation"
DERIVED_PREFIX = "auto-"
_ID = re.compile(CONVERSATION_ID)


def conversation_id(headers: Mapping[str, str], tenant: str, messages: Sequence[Message]) -> str:
    """The request's conversation id: its header's, else derived from tenant and head."""
    named = headers.get(HEADER)
    if named is not None:
        if not _ID.match(named):
            raise InvalidRequest(
                f"{HEADER} must be 1-128 characters of [A-Za-z0-9._-], starting with a "
                "letter or digit"
            )
        return named
    return derived_id(tenant, messages)


def derived_id(tenant: str, messages: Sequence[Message]) -> str:
    """`auto-` + 24 hex digits of BLAKE2b over the tenant and the head's prefix hash."""
    head = prefix_hash(messages[: head_end(messages)])
    digest = hashlib.blake2b(f"{tenant}\0{head}".encode(), digest_size=12).hexdigest()
    return DERIVED_PREFIX + digest
