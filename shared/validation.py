"""Validation that a growing transcript pays for in O(new): the checked prefix is remembered.

Clients resend the whole transcript every turn. `ValidatedPrefixes` keeps the last transcripts
it checked as private copies (a few conversations at once, keyed by their opening messages);
a transcript that equals one of them up to its length, compared by plain list equality in C,
is checked only from there on. The copies reach every checked field, so a message changed in
place no longer equals its copy and is checked again.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared.counting.cache import private_copy
from shared.counting.messagekeys import message_key
from shared.messages import Message, Open, validate, validate_from

_T = TypeVar("_T")


@dataclass(slots=True)
class _Entry(Generic[_T]):
    """One conversation's last checked transcript; read and grown only under the memo's lock."""

    copies: list[Any]  # private copies of the transcript checked last
    pending: Open | None  # tool calls still unanswered after them
    state: _T | None  # what the caller derived from exactly these messages
    frozen: list[Message] | None = None  # that transcript itself, when its caller froze it


class ValidatedPrefixes(Generic[_T]):
    """Validate transcripts, re-checking only what is new since the same conversation's last.

    `validate_with` also keeps a caller's state per conversation (a `Ledger`), grown under
    the same lock from messages that have just been matched or checked, so the state always
    describes messages equal, by content, to the transcript it is returned with.
    """

    def __init__(self, max_conversations: int = 64, max_messages: int = 20_000) -> None:
        self.max_conversations = max_conversations
        self.max_messages = max_messages
        self._memo: OrderedDict[Hashable, _Entry[_T]] = OrderedDict()
        self._lock = threading.Lock()

    def validate(self, transcript: Any) -> list[Message]:
        """Like `messages.validate`, and as strict: same result, same errors."""
        return self.validate_with(transcript, None)[0]

    def validate_with(
        self,
        transcript: Any,
        grow: Callable[[_T | None, list[Message]], _T] | None,
        conversation: Hashable | None = None,
        *,
        frozen: bool = False,
    ) -> tuple[list[Message], _T | None]:
        """`validate(transcript)`, and the conversation's state grown to it by `grow`.

        `conversation` names the entry to check against (a store's tenant and id): without
        it, transcripts that open alike share one. Either way the entry is used only when the
        transcript equals it by content, so a name decides what is remembered, never what is
        accepted. The state is None when the transcript is not remembered (not a list, too
        long).

        `frozen` is the caller's promise that neither `transcript` nor any of its messages
        will ever change (a store's immutable snapshots). Messages a frozen transcript shares,
        as the same objects, with the frozen transcript checked last are then known to be
        equal to it without comparing them field by field: on a server that comparison of a
        long transcript, in memory the CPU caches no longer hold, costs a tenth of a prepare.
        """
        msgs = validate(transcript[:2]) if isinstance(transcript, list | tuple) else None
        if msgs is None or type(transcript) is not list or not transcript:
            return validate(transcript), None
        key = _key(transcript) if conversation is None else (_NAMED, conversation)
        if key is None:
            return validate(transcript), None
        with self._lock:
            return transcript, self._check(key, transcript, grow, frozen)

    def _check(
        self,
        key: Hashable,
        transcript: list[Message],
        grow: Callable[[_T | None, list[Message]], _T] | None,
        frozen: bool,
    ) -> _T | None:
        entry = self._memo.get(key)
        if entry is not None and not (
            (frozen and _shares(transcript, entry.frozen)) or _extends(transcript, entry.copies)
        ):
            entry = None
        k = len(entry.copies) if entry is not None else 0
        pending = validate_from(transcript, k, entry.pending if entry is not None else None)
        if len(transcript) > self.max_messages:
            return None
        if entry is None:
            entry = self._memo[key] = _Entry([], None, None)
        try:
            entry.state = grow(entry.state, transcript) if grow is not None else entry.state
        except BaseException:
            del self._memo[key]  # the state may be half grown: never use it again
            raise
        entry.copies += [private_copy(m) for m in transcript[k:]]  # grown in place: O(new)
        entry.pending = pending
        entry.frozen = transcript if frozen else None
        self._memo.move_to_end(key)
        while len(self._memo) > self.max_conversations:
            self._memo.popitem(last=False)
        return entry.state


_NAMED = object()  # tags the entries named by the caller: never equal to an opening's key


def _extends(transcript: list[Message], copies: list[Any]) -> bool:
    """Whether `transcript` starts with messages equal to `copies` (in C, stops early)."""
    k = len(copies)
    if not k or len(transcript) < k:
        return False
    return (transcript if len(transcript) == k else transcript[:k]) == copies


def _shares(transcript: list[Message], frozen: list[Message] | None) -> bool:
    """Whether `transcript` starts with the very message objects of `frozen` (identity only:
    both were frozen, so those messages are still what was checked)."""
    if frozen is None or len(transcript) < len(frozen):
        return False
    return transcript is frozen or all(map(operator.is_, transcript, frozen))


def _key(transcript: list[Message]) -> Hashable | None:
    """Which conversation this probably is: its opening messages, by content."""
    try:
        key = tuple(message_key(m) for m in transcript[:2])
        hash(key)
        return key
    except TypeError:  # an unhashable field: no memo, the full check will say what is wrong
        return None
