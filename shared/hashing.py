"""Content hashes of messages and of transcript prefixes.

These hashes are persisted (summary records are keyed by them), so their definition is
versioned and must never change silently. Version 1, the only one so far:

- canonical encoding of a message: `json.dumps(message, sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)` encoded as UTF-8: every key counts, key order
  and whitespace do not;
- message digest: BLAKE2b with a 16-byte digest of that encoding;
- prefix chain: `h(0) = BLAKE2b-16(b"prefit-prefix-v1")` and
  `h(k+1) = BLAKE2b-16(h(k) + digest(message k))`;
- the prefix hash of the first `k` messages is `"v1:" + hex(h(k))`.

Every prefix hash of a transcript comes out of one O(n) pass (`prefix_hashes`), and a stored
chain grows in O(new) from its last hash (`extend_chain`).
Changing anything above means a new version prefix, so old records simply stop matching.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shared.errors import ConfigError

VERSION = "v1"
_SEED = hashlib.blake2b(b"prefit-prefix-v1", digest_size=16).digest()


def canonical(message: Mapping[str, Any]) -> bytes:
    """The canonical byte encoding of one message."""
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def message_digest(message: Mapping[str, Any]) -> bytes:
    """16-byte content digest of one message."""
    return hashlib.blake2b(canonical(message), digest_size=16).digest()


def _chain(messages: Sequence[Mapping[str, Any]]) -> Iterator[bytes]:
    h = _SEED
    yield h
    for m in messages:
        h = hashlib.blake2b(h + message_digest(m), digest_size=16).digest()
        yield h


def prefix_hashes(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """`out[k]` is the prefix hash of `messages[:k]`, for k = 0..len(messages)."""
    return [f"{VERSION}:{h.hex()}" for h in _chain(messages)]


def prefix_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prefix hash of all of `messages`."""
    *_, last = _chain(messages)
    return f"{VERSION}:{last.hex()}"


EMPTY = prefix_hash([])  # the hash of no messages: every chain's start


def extend_chain(last: str, messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Prefix hashes of `messages` appended to a prefix whose hash is `last` (one per message)."""
    version, _, hexdigest = last.partition(":")
    try:
        h = bytes.fromhex(hexdigest) if version == VERSION else b""
    except ValueError:
        h = b""
    if len(h) != 16:
        raise ConfigError(f"prefix hash {last!r} is not a {VERSION} hash")
    out: list[str] = []
    for m in messages:
        h = hashlib.blake2b(h + message_digest(m), digest_size=16).digest()
        out.append(f"{VERSION}:{h.hex()}")
    return out
