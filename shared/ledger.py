"""Ledger: running per-message sizes of one conversation, grown in O(new) as it is resent.

`prepare` with the default strategies reduces a transcript position by position (a tool
result shortened, a tool result cleared) and then drops whole turn groups from the oldest.
Every one of those steps is a sum over a range of per-message sizes, so a ledger that keeps
prefix sums of the sizes each message would have at each step lets `Cut` (shared/cut.py)
decide the whole pipeline with a few bisections, and build only the messages it keeps.

A ledger is only ever extended from messages that `ValidatedPrefixes` has just matched or
checked for its conversation (under its lock): the positions it covers are equal, by
content, to the transcript it is used with. It holds numbers and positions, never text.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from shared.counters import CachedCounter
from shared.messages import Message, groups
from shared.strategies import ClearToolResults, TruncateToolResults


@dataclass(frozen=True)
class Steps:
    """What per-message facts depend on: the counter and the two per-message strategies."""

    base: CachedCounter
    truncate: TruncateToolResults
    clear: ClearToolResults

    def signature(self) -> tuple[object, ...]:
        """The strategy settings per-message facts depend on (the counter is compared by
        identity)."""
        t, c = self.truncate, self.clear
        return (t.max_chars, t.head, c.placeholder)


class Ledger:
    """Prefix sums of message sizes as sent, after truncation, and saved by clearing.

    `cum_raw[i]`, `cum_short[i]` and `cum_saved[i]` sum messages `[0, i)`: their sizes, their
    sizes after `TruncateToolResults`, and what `ClearToolResults` would save on each
    clearable tool result (size truncated minus size cleared). Position lists are sorted.
    """

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.signature = steps.signature()
        # machine integers, 8 bytes an entry: a ledger per conversation must stay small
        self.cum_raw = array("q", [0])
        self.cum_short = array("q", [0])
        self.cum_saved = array("q", [0])
        self.tools = array("q")  # tool results
        self.shortened = array("q")  # tool results TruncateToolResults changes
        self.clearable = array("q")  # tool results ClearToolResults may replace
        self.starts = array("q")  # turn groups
        self.users = array("q")  # user messages

    def __len__(self) -> int:
        return len(self.cum_raw) - 1

    def fits(self, steps: Steps) -> bool:
        """Whether this ledger was built with the same counter and strategy settings."""
        return steps.signature() == self.signature and steps.base is self.steps.base

    def extend(self, messages: Sequence[Message]) -> None:
        """Take in `messages[len(self):]` (the earlier ones are the ones already taken in)."""
        start = len(self)
        if start >= len(messages):
            return
        base, placeholder = self.steps.base, self.steps.clear.placeholder
        sizes = base.message_counts(messages[start:])
        for i, size in enumerate(sizes, start):
            m = messages[i]
            self.cum_raw.append(self.cum_raw[-1] + size)
            if m.get("role") == "user":
                self.users.append(i)
            if m.get("role") != "tool":
                self.cum_short.append(self.cum_short[-1] + size)
                self.cum_saved.append(self.cum_saved[-1])
                continue
            self.tools.append(i)
            short = self.steps.truncate.shorten(m)
            if short is not None:
                self.shortened.append(i)
                size = base.count_message(short)
            self.cum_short.append(self.cum_short[-1] + size)
            saved = 0
            if (short or m).get("content") != placeholder:
                self.clearable.append(i)
                saved = size - base.count_message({**m, "content": placeholder})
            self.cum_saved.append(self.cum_saved[-1] + saved)
        self._regroup(messages)

    def _regroup(self, messages: Sequence[Message]) -> None:
        """Group starts up to the end: only the last group can have grown."""
        last = self.starts.pop() if self.starts else 0
        self.starts.extend(a for a, _ in groups(messages, last))

    # --- queries, for a transcript of the first `n` positions --------------------------
    def tool_count(self, n: int) -> int:
        return bisect_left(self.tools, n)

    def shortened_in(self, a: int, b: int) -> array[int]:
        """Positions in `[a, b)` that truncation changes."""
        s = self.shortened
        return s[bisect_left(s, a) : bisect_left(s, b)]

    def clearable_in(self, a: int, b: int) -> array[int]:
        """Positions in `[a, b)` that clearing may replace."""
        c = self.clearable
        return c[bisect_left(c, a) : bisect_left(c, b)] if a < b else array("q")

    def last_user(self, n: int) -> int | None:
        """Position of the last user message among the first `n`, None if there is none."""
        k = bisect_left(self.users, n)
        return self.users[k - 1] if k else None

    def group_starts(self, a: int, b: int) -> array[int]:
        """Starts of the turn groups that start in `[a, b)`."""
        s = self.starts
        return s[bisect_left(s, a) : bisect_left(s, b)]


def grow(steps: Steps, ledger: Ledger | None, messages: list[Message]) -> Ledger:
    """`ledger` extended to `messages`, or a new one when it was built differently."""
    if ledger is None or not ledger.fits(steps):
        ledger = Ledger(steps)
    ledger.extend(messages)
    return ledger
