"""Content hashes of messages and of transcript prefixes.

These hashes are persisted (summary records are keyed by them), so their definition is
versioned and must never change silently. Version 2, the current one:

- canonical encoding of a message: `json.dumps(message, sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)` encoded as UTF-8: every key counts, key order
  and whitespace do not;
- message digest: BLAKE2b with a 16-byte digest of that encoding, as 32 lowercase hex digits;
- prefix chain, on the text of the hashes: `h(0) = "v2:" + sha1("prefit-prefix-v2")[:32]` and
  `h(k+1) = "v2:" + sha1(h(k) + digest(message k))[:32]` (SHA-1 over the UTF-8 of the two
  strings joined, as hex, first 32 digits);
- the prefix hash of the first `k` messages is `h(k)`.

Why SHA-1 for the chain step: Redis's Lua has `redis.sha1hex` and no BLAKE2b, and an append
must extend the stored chain in one server-side step from a tip only the server knows at that
moment (shared/store/scripts.py does exactly this step). The content itself is still hashed
with BLAKE2b in Python; SHA-1 only folds a fixed-size digest into the previous hash, so
colliding two chains would take a BLAKE2b preimage, not just a SHA-1 collision. Test vectors
pin the definition (tests/shared/test_hashing.py), and the Lua step is checked against it.

Version 1 (BLAKE2b for the chain step too) is gone: its hashes simply stop matching.
Every prefix hash of a transcript comes out of one O(n) pass (`prefix_hashes`), and a stored
chain grows in O(new) from its last hash (`extend_chain`).
Changing anything above means a new version prefix, so old records simply stop matching.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shared.errors import ConfigError, InvalidTranscript

VERSION = "v2"
HEX_DIGITS = 32  # of a digest and of a prefix hash
_HASH = re.compile(rf"{VERSION}:[0-9a-f]{{{HEX_DIGITS}}}")


def canonical(message: Mapping[str, Any]) -> bytes:
    """The canonical byte encoding of one message."""
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def message_digest(message: Mapping[str, Any]) -> str:
    """Content digest of one message: BLAKE2b-16 of its canonical encoding, in hex."""
    return digest_of(canonical(message))


def digest_of(encoded: bytes) -> str:
    """`message_digest` of a message already in its canonical encoding."""
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()


def chain_step(previous: str, digest: str) -> str:
    """The prefix hash after appending a message of `digest` to a prefix hashed `previous`."""
    return f"{VERSION}:{hashlib.sha1((previous + digest).encode()).hexdigest()[:HEX_DIGITS]}"


EMPTY = f"{VERSION}:{hashlib.sha1(b'prefit-prefix-v2').hexdigest()[:HEX_DIGITS]}"


def _chain(start: str, messages: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """The chain over `messages`; `InvalidTranscript` (with the index) for a message that has
    no canonical encoding (a lone surrogate, which UTF-8 cannot encode and no provider
    accepts, or a value JSON cannot encode), as the store refuses to write it."""
    h = start
    for i, m in enumerate(messages):
        try:
            digest = message_digest(m)
        except (TypeError, ValueError) as exc:
            raise InvalidTranscript(f"message is not JSON-encodable: {exc}", i) from None
        h = chain_step(h, digest)
        yield h


def prefix_hashes(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """`out[k]` is the prefix hash of `messages[:k]`, for k = 0..len(messages).

    - messages: the transcript's messages; one with no canonical encoding (a value JSON
      cannot encode, a lone surrogate) is `InvalidTranscript`, with its index.
    """
    return [EMPTY, *_chain(EMPTY, messages)]


def prefix_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prefix hash of all of `messages` (the last of `prefix_hashes(messages)`).

    - messages: as for `prefix_hashes`.
    """
    h = EMPTY
    for h in _chain(EMPTY, messages):  # noqa: B007 (the last one is the answer)
        pass
    return h


def extend_chain(last: str, messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Prefix hashes of `messages` appended to a prefix whose hash is `last` (one per message)."""
    if not isinstance(last, str) or not _HASH.fullmatch(last):
        raise ConfigError(f"prefix hash {last!r} is not a {VERSION} hash")
    return list(_chain(last, messages))
