"""Where token counts are remembered: by content key, and by position for the last transcript.

`CountCache` keeps counts by content key; `RecentTranscript` keeps those of the transcript
counted last, by position.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from shared.counting.messagekeys import Key, fields
from shared.errors import ConfigError
from shared.messages import Message


class CountCache:
    """Token counts by key, bounded by entries and by characters of text held.

    Two generations approximate an LRU without bookkeeping on a hit (a hit is one dict
    lookup): new entries go to the young generation; when it reaches half of either bound it
    becomes the old one and the previous old one is dropped; an old entry used again moves
    back to the young one. So at most `max_entries` entries and `max_chars` characters are
    held, and whatever was used within the last generation survives. Reads take no lock
    (a racing reader at worst misses and recounts); writes do. A key holding more than half
    of `max_chars` is never cached.
    """

    def __init__(self, max_entries: int = 100_000, max_chars: int = 64_000_000) -> None:
        for name, value in (("max_entries", max_entries), ("max_chars", max_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ConfigError(f"{name} must be an integer >= 2, got {value!r}")
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._young: dict[Hashable, int] = {}
        self._old: dict[Hashable, int] = {}
        self._young_chars = 0
        self._old_chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    @property
    def chars(self) -> int:
        """Characters of text the cached keys hold (an entry in both generations counts twice)."""
        return self._young_chars + self._old_chars

    def get(self, key: Key) -> int | None:
        """The cached count of one key, None if unknown."""
        found = self._young.get(key)
        if found is None and (found := self._old.get(key)) is not None:
            self.put(key, found)
        return found

    def get_many(self, keys: Sequence[Key]) -> list[int | None]:
        """The cached count of each key, None where unknown."""
        values: list[int | None] = list(map(self._young.get, keys))
        if None in values and self._old:
            old = self._old
            for i in missing(values):
                found = old.get(keys[i])
                if found is not None:
                    values[i] = found
                    self.put(keys[i], found)
        return values

    def put(self, key: Key, value: int) -> None:
        """Remember `value` for `key` unless the key's text is too large to hold."""
        weight = sum(map(len, fields(key).texts))
        half_entries, half_chars = self.max_entries // 2, self.max_chars // 2
        if weight > half_chars:
            return
        with self._lock:
            if key in self._young:
                return
            if len(self._young) >= half_entries or self._young_chars + weight > half_chars:
                self._old, self._old_chars = self._young, self._young_chars
                self._young, self._young_chars = {}, 0
            self._young[key] = value
            self._young_chars += weight


class RecentTranscript:
    """The last transcript counted (up to `max_messages`), as private copies with their counts.

    A transcript counted again, or grown by a few messages, is matched against the copies by
    plain list equality, which runs in C and stops at the first difference: its known leading
    counts come back without building any key. The copies are the caller's messages copied
    down to every counted field, so a message changed in place no longer equals its copy.
    A message with non-string tool-call arguments gets a copy that equals nothing (dict
    equality would take 1 for 1.0 or True, which serialize differently).

    The copies follow the newest state of a conversation: a count of a list longer than them
    replaces (or, if it extends them, grows) them; a list no longer than them (a cut, a head,
    a tail, counted while preparing) leaves them alone. At most `max_messages` messages and
    `max_chars` characters of string content are held.
    """

    def __init__(self, max_messages: int = 50_000, max_chars: int = 64_000_000) -> None:
        self.max_messages = max_messages
        self.max_chars = max_chars
        # (copies, counts, chars): replaced whole, so a reader always sees an aligned pair
        self._recent: tuple[list[Any], list[int], int] = ([], [], 0)

    def __len__(self) -> int:
        return len(self._recent[0])

    def known(self, messages: list[Message]) -> list[int]:
        """Counts of the leading messages that equal the remembered ones."""
        copies, counts, _ = self._recent
        m = min(len(messages), len(copies))
        if m == 0 or messages[0] != copies[0]:
            return []
        if messages[:m] == copies[:m]:
            return counts[:m]
        flags = list(map(operator.eq, messages[:m], copies))
        return counts[: flags.index(False)]

    def remember(self, messages: list[Message], known: int, counts: list[int]) -> None:
        """Record the aligned `counts` of `messages`, whose first `known` matched."""
        copies, old, chars = self._recent
        n, size = len(messages), len(copies)
        if n > self.max_messages or known == n or (n <= size and known < size):
            return  # nothing new, or a variant no longer than the copies: keep them
        if known == size:
            new = messages[size:]
            grown = (copies + [private_copy(m) for m in new], old + counts[size:])
            recent = (*grown, chars + _content_chars(new))
        else:
            recent = ([private_copy(m) for m in messages], list(counts), _content_chars(messages))
        if recent[2] <= self.max_chars:
            self._recent = recent


def _content_chars(messages: list[Message]) -> int:
    return sum(len(c) for m in messages if type(c := m.get("content")) is str)


class _Never:
    """Stands for a message whose copy must never match (its equality is not exact)."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


_NEVER = _Never()


def private_copy(m: Message) -> Any:
    """A copy of `m` that no in-place change of a counted field of `m` can reach."""
    out = dict(m)
    content = out.get("content")
    if type(content) is list:
        out["content"] = [dict(p) if isinstance(p, dict) else p for p in content]
    calls = out.get("tool_calls")
    if type(calls) is list:
        copied = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("arguments", ""), str):
                return _NEVER
            copied.append(dict(call, function=dict(fn)))
        out["tool_calls"] = copied
    if type(out.get("function_call")) is dict:
        out["function_call"] = dict(out["function_call"])
    return out


def missing(values: list[int | None]) -> list[int]:
    """Indices of the None values, found at C speed (a grown transcript misses only a few)."""
    out: list[int] = []
    i = -1
    try:
        while True:
            i = values.index(None, i + 1)
            out.append(i)
    except ValueError:
        return out
