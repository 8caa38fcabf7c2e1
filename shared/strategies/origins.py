"""Where each message being cut came from, recovered after anyone replaced the list.

The reference lets a strategy reduce `work.messages` by replacing the list; a strategy
written from it does not know about `Work.origin`. The built-ins need each message's index
in the original transcript (to protect the head and the recent tail, to keep turn groups
whole, to find what a summary covers), so when the list changed behind their back they
recover it: by identity first (a message kept as it was), then by content (a copy), and
otherwise the message is `UNKNOWN`: cuttable like any old turn, never protected.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from shared.counting.messagekeys import message_key
from shared.messages import Message

SYNTHETIC = -1  # a message prefit wrote (a summary, a drop marker)
UNKNOWN = -2  # a message someone else wrote that matches nothing of the transcript


def recover(
    messages: Sequence[Any],
    known: Sequence[Message],
    known_origin: Sequence[int],
    transcript: Sequence[Message],
) -> list[int]:
    """The origin of each of `messages`, given the last aligned state (`known`, `known_origin`).

    A transcript index is given to one message at most, in order where content repeats;
    prefit's own messages stay `SYNTHETIC` when kept or copied.
    """
    by_id: dict[int, int] = {id(t): i for i, t in enumerate(transcript)}
    by_id.update(zip(map(id, known), known_origin, strict=False))
    finder = _ByContent(known, known_origin, transcript)
    used: set[int] = set()
    out: list[int] = []
    last = -1
    for m in messages:
        o = by_id.get(id(m))
        if o is None or (o >= 0 and o in used):
            o = finder.find(m, after=last, used=used)
        if o >= 0:
            used.add(o)
            last = o
        out.append(o)
    return out


class _ByContent:
    """Transcript positions (and known synthetic messages) by content, built on first use."""

    def __init__(
        self, known: Sequence[Message], known_origin: Sequence[int], transcript: Sequence[Message]
    ) -> None:
        self._known = known
        self._known_origin = known_origin
        self._transcript = transcript
        self._index: dict[Hashable, list[int]] | None = None

    def find(self, m: Any, *, after: int, used: set[int]) -> int:
        key = _key(m)
        if key is None:
            return UNKNOWN
        candidates = self._positions().get(key, [])
        free = [i for i in candidates if i >= 0 and i not in used and self._equal(i, m)]
        if free:
            later = [i for i in free if i > after]
            return later[0] if later else free[0]
        if SYNTHETIC in candidates:
            return SYNTHETIC
        return UNKNOWN

    def _equal(self, i: int, m: Any) -> bool:
        if i < len(self._transcript) and self._transcript[i] == m:
            return True
        return any(o == i and k == m for k, o in zip(self._known, self._known_origin, strict=False))

    def _positions(self) -> dict[Hashable, list[int]]:
        if self._index is None:
            index: dict[Hashable, list[int]] = {}
            for i, t in enumerate(self._transcript):
                k = _key(t)
                if k is not None:
                    index.setdefault(k, []).append(i)
            for m, o in zip(self._known, self._known_origin, strict=False):
                k = _key(m)
                if k is not None and o not in index.get(k, ()):
                    index.setdefault(k, []).append(o)
            for positions in index.values():
                positions.sort()
            self._index = index
        return self._index


def _key(m: Any) -> Hashable | None:
    if not isinstance(m, dict):
        return None
    try:
        key = message_key(m)
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None
