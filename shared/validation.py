"""Validation that a growing transcript pays for in O(new): the checked prefix is remembered.

Clients resend the whole transcript every turn. `ValidatedPrefixes` keeps the last transcripts
it checked as private copies (a few conversations at once, keyed by their opening messages);
a transcript that equals one of them up to its length, compared by plain list equality in C,
is checked only from there on. The copies reach every checked field, so a message changed in
place no longer equals its copy and is checked again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from shared.countcache import private_copy
from shared.messagekeys import message_key
from shared.messages import Message, validate, validate_from

_Entry = tuple[list[Any], set[str] | None]  # (private copies, open tool-call ids after them)


class ValidatedPrefixes:
    """Validate transcripts, re-checking only what is new since the same conversation's last."""

    def __init__(self, max_conversations: int = 64, max_messages: int = 20_000) -> None:
        self.max_conversations = max_conversations
        self.max_messages = max_messages
        self._memo: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def validate(self, transcript: Any) -> list[Message]:
        """Like `messages.validate`, and as strict: same result, same errors."""
        msgs = validate(transcript[:2]) if isinstance(transcript, list | tuple) else None
        if msgs is None or type(transcript) is not list or not transcript:
            return validate(transcript)
        key = _key(transcript)
        if key is None:
            return validate(transcript)
        with self._lock:
            entry = self._memo.get(key)
        copies, pending = entry if entry is not None else ([], None)
        k = len(copies)
        if not (k and len(transcript) >= k and transcript[:k] == copies):
            k, copies, pending = 0, [], None
        pending = validate_from(transcript, k, pending)
        if len(transcript) <= self.max_messages and len(transcript) > k:
            grown = copies + [private_copy(m) for m in transcript[k:]]
            with self._lock:
                self._memo[key] = (grown, pending)
                self._memo.move_to_end(key)
                while len(self._memo) > self.max_conversations:
                    self._memo.popitem(last=False)
        return transcript


def _key(transcript: list[Message]) -> Hashable | None:
    """Which conversation this probably is: its opening messages, by content."""
    try:
        key = tuple(message_key(m) for m in transcript[:2])
        hash(key)
        return key
    except TypeError:  # an unhashable field: no memo, the full check will say what is wrong
        return None
