"""Writing a conversation in one server-side step: messages, prefix chain, tally, metadata.

An append is one Lua call (`scripts.APPEND`) that pushes the messages, extends the stored
prefix chain from the tip it finds (`shared.hashing.chain_step`, computed in Lua from the
message digests computed here), extends the running token tally with the per-message counts
and updates the metadata, or refuses and changes nothing. Where it may land is the caller's
to say (`Append`):

- `after`: the tip hash the messages were validated against (they answer its tool calls, or
  the tip is bound): refused with `tip` if the tip moved;
- `free`: the messages are valid after any unbound tip: they land wherever the tip is when
  the script runs, unless the stored tip is bound (`bound`), which refuses with `bound`;
- neither: the store's own unchecked append (`ConversationStore.append`).

A tip is *bound* when an append must be checked against it exactly: it has tool calls not yet
answered, or the head (system messages and the first user message) may still grow. Every
write stores that flag; a conversation without it (absent, or written by the store's own
unchecked append) counts as bound. A refusal for `tip` or `bound` is a semantic conflict the
caller resolves by reading again and validating again; it never means "try your luck again".

`expected_length` refuses with `length` (the caller's `LengthMismatch`). When the append lands
at the length the caller viewed, the same call also measures it: the best summary record
within `upto_max` and the tally at its end and at the head's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import ConfigError, InvalidTranscript, LengthMismatch
from shared.hashing import EMPTY, canonical, digest_of
from shared.messages import Message
from shared.store import keys, scripts
from shared.store.client import Client, guarded, text, ttl_ms
from shared.store.compression import pack
from shared.store.directory import Directory
from shared.store.replication import Replication
from shared.summaries.book import SummaryRecord


@dataclass(frozen=True)
class Append:
    """One append: the messages, where they may land, and what they change."""

    messages: Sequence[Message]
    counts: Sequence[int] | None = None  # base tokens per message, to extend the tally
    counter: str = ""  # id of the counter that made `counts` ('' drops the tally)
    after: str | None = None  # the tip hash the messages were validated against
    free: bool = False  # valid after any unbound tip
    expected_length: int | None = None
    bound: bool = True  # whether the tip is bound once the messages land
    head_end: int | None = None  # the head's end once they land (None: unchanged)
    viewed: int | None = None  # the length the caller read, to measure when landing there
    upto_max: int | None = None  # how far a summary record may reach, for the measurement
    model: str | None = None


@dataclass(frozen=True)
class Replacement:
    """A whole transcript, its prefix chain (len n+1) and cumulative base token counts."""

    messages: Sequence[Message]
    hashes: Sequence[str]
    cumulative: Sequence[int] | None = None  # len n: counts of the first 1..n messages
    counter: str = ""
    expected_length: int | None = None
    bound: bool = True
    head_end: int = 0
    upto_max: int | None = None
    model: str | None = None


@dataclass(frozen=True)
class Written:
    """What a write did. `refused` is 'tip' or 'bound' for an append that must be validated
    again (nothing changed). `total` is the tally's count of all `length` messages (None if
    the tally was dropped); `measured` says `best`, `tokens_upto` and `tokens_head` are set."""

    refused: str | None
    old_length: int
    old_hash: str
    length: int
    last_hash: str
    total: int | None = None
    measured: bool = False
    best: SummaryRecord | None = None
    tokens_upto: int = 0
    tokens_head: int = 0


class Writes:
    """Appends and replaces of every tenant's conversations, on one Redis client."""

    def __init__(
        self,
        client: Client,
        directory: Directory,
        *,
        retention_s: float,
        clock: Callable[[], float] = time.time,
        replication: Replication | None = None,
    ) -> None:
        self._directory = directory
        self._replication = replication or Replication.never(client)
        self._ttl = ttl_ms(retention_s)
        self._clock = clock
        self._append = client.register_script(scripts.APPEND)
        self._replace = client.register_script(scripts.REPLACE)

    @guarded
    def append(self, tenant: str, conv_id: str, a: Append) -> Written:
        """Apply `a` in one step, or refuse (`LengthMismatch`; `Written.refused`)."""
        encoded = encode(a.messages)
        digests = [digest_of(raw) for raw in encoded]
        counts = list(a.counts) if a.counts is not None else [0] * len(encoded)
        if len(counts) != len(encoded):
            raise ConfigError("an append needs one count per message")
        args: list[Any] = [
            _opt(a.expected_length),
            a.after or "",
            "free" if a.free else "",
            self._ttl,
            repr(self._clock()),
            a.model or "",
            keys.record_prefix(tenant, conv_id),
            a.counter if a.counts is not None else "",
            _flag(a.bound),
            _opt(a.head_end),
            _opt(a.upto_max),
            _opt(a.viewed),
            EMPTY,
            len(encoded),
            *map(pack, encoded),
            *digests,
            *counts,
        ]
        reply = self._replication.run(self._append, conv_keys(tenant, conv_id), args)
        if not reply[0]:
            reason, length, tip = text(reply[1]), int(reply[2]), text(reply[3])
            if reason == "length":
                raise LengthMismatch(int(a.expected_length or 0), length)
            return Written(reason, length, tip, length, tip)
        _, old_len, old_tip, length, tip, total, record, at_upto, at_head = reply
        return Written(
            None,
            int(old_len),
            text(old_tip),
            int(length),
            text(tip),
            total=int(total) if int(total) >= 0 else None,
            measured=int(total) >= 0 and a.upto_max is not None and int(old_len) == a.viewed,
            best=SummaryRecord.from_json(record) if record else None,
            tokens_upto=int(at_upto),
            tokens_head=int(at_head),
        )

    @guarded
    def replace(self, tenant: str, conv_id: str, r: Replacement) -> Written:
        """Write the whole transcript in one step (`LengthMismatch` if `expected_length`
        differs), dropping the summary records whose prefix no longer matches; then drop the
        conversation from their copies in the tenant's directory (a second step)."""
        encoded = encode(r.messages)
        if len(r.hashes) != len(encoded) + 1:
            raise ConfigError("a replacement needs one prefix hash more than messages")
        cumulative = list(r.cumulative) if r.cumulative is not None else []
        if r.cumulative is not None and len(cumulative) != len(encoded):
            raise ConfigError("a replacement needs one cumulative count per message")
        args: list[Any] = [
            _opt(r.expected_length),
            self._ttl,
            repr(self._clock()),
            r.model or "",
            keys.record_prefix(tenant, conv_id),
            r.counter if r.cumulative is not None else "",
            _flag(r.bound),
            r.head_end,
            _opt(r.upto_max),
            r.hashes[-1],
            len(encoded),
            *map(pack, encoded),
            *r.hashes[1:],
            *cumulative,
        ]
        blocks = [keys.conv_blocked(tenant, conv_id), keys.conv_block_count(tenant, conv_id)]
        reply = self._replication.run(self._replace, [*conv_keys(tenant, conv_id), *blocks], args)
        if not reply[0]:
            raise LengthMismatch(int(r.expected_length or 0), int(reply[1]))
        _, length, record, at_upto, at_head, dropped = reply
        self._directory.drop(tenant, conv_id, [text(h) for h in dropped])
        return Written(
            None,
            0,
            EMPTY,
            int(length),
            r.hashes[-1],
            total=cumulative[-1] if cumulative else (0 if r.cumulative is not None else None),
            measured=r.cumulative is not None and r.upto_max is not None,
            best=SummaryRecord.from_json(record) if record else None,
            tokens_upto=int(at_upto),
            tokens_head=int(at_head),
        )


def conv_keys(tenant: str, conv_id: str) -> list[str]:
    """KEYS of the write scripts: messages, hashes, metadata, summary index, tally, its info."""
    return [
        keys.conv_messages(tenant, conv_id),
        keys.conv_hashes(tenant, conv_id),
        keys.conv_meta(tenant, conv_id),
        keys.conv_index(tenant, conv_id),
        keys.conv_tally(tenant, conv_id),
        keys.conv_tally_info(tenant, conv_id),
    ]


def encode(messages: Sequence[Message]) -> list[bytes]:
    """The canonical JSON of each message; `InvalidTranscript` naming the first that is not a
    JSON object."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidTranscript("messages must be a list of message objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidTranscript(f"message must be an object, got {type(m).__name__}", i)
        try:
            out.append(canonical(m))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidTranscript(f"message is not JSON-encodable: {exc}", i) from None
    return out


def _opt(value: int | None) -> Any:
    return "" if value is None else int(value)


def _flag(value: bool) -> str:
    return "1" if value else "0"
