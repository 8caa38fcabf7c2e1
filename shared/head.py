"""The head of a conversation: what every prompt keeps, whatever else is cut.

The head is the leading system/developer messages plus the user's first message (the task),
wherever that message stands. Customer-service and voice transcripts open with the agent's
greeting, so the task is often the second message: what stands between the leading messages
and the task (the *gap*) is kept with them when it is small, as a greeting is. A large gap
(an agent that worked for a while before the user spoke) is ordinary conversation: it may be
cleared or dropped like any old turn, while the task itself is still kept.

`Head.end` is where the head's region ends: one past the task (or past the leading messages
when there is no user message yet). Summaries cover `[end, upto)`, so a summary never folds
the task in; a prompt served from a summary keeps `[0, end)` whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.messages import HEAD_ROLES, Message, text_of

# A gap before the task is kept whole when it is at most this big (a greeting, a short
# introduction): beyond it, keeping it could cost a small window more than the task itself.
GAP_MAX_MESSAGES = 4
GAP_MAX_CHARS = 2_000


@dataclass(frozen=True)
class Head:
    """Where the head is: `lead` leading system/developer messages, the task at `task`."""

    lead: int
    task: int | None
    gap_kept: bool

    @property
    def end(self) -> int:
        """One past the head's region (the task, else the leading messages)."""
        return self.task + 1 if self.task is not None else self.lead

    @property
    def gap(self) -> tuple[int, int]:
        """The half-open range between the leading messages and the task that may be cut
        (empty when the gap is kept or there is none)."""
        if self.task is None or self.gap_kept:
            return (self.lead, self.lead)
        return (self.lead, self.task)

    @property
    def contiguous(self) -> bool:
        """True when the head is all of `[0, end)`."""
        lo, hi = self.gap
        return lo == hi

    @property
    def final(self) -> bool:
        """True once the task is known: later messages cannot change the head."""
        return self.task is not None

    def protects(self, index: int) -> bool:
        """Whether the message at `index` of the transcript belongs to the head."""
        lo, hi = self.gap
        return 0 <= index < self.end and not lo <= index < hi

    def size(self) -> int:
        """How many messages the head keeps."""
        lo, hi = self.gap
        return self.end - (hi - lo)

    def describe(self) -> dict[str, Any]:
        """The head as a report states it."""
        return {
            "end": self.end,
            "first_user": self.task,
            "leading": self.lead,
            "messages": self.size(),
            "gap_kept": self.gap_kept if self.task is not None and self.task > self.lead else None,
        }


def head_of(msgs: Sequence[Message], *, keep_first_user: bool = True) -> Head:
    """The head of `msgs` (see the module docstring)."""
    lead = 0
    n = len(msgs)
    while lead < n and msgs[lead].get("role") in HEAD_ROLES:
        lead += 1
    if not keep_first_user:
        return Head(lead, None, True)
    task = next((i for i in range(lead, n) if msgs[i].get("role") == "user"), None)
    if task is None:
        return Head(lead, None, True)
    return Head(lead, task, _small(msgs[lead:task]))


def head_end(msgs: Sequence[Message], *, keep_first_user: bool = True) -> int:
    """End of the head's region: one past the first user message, else the leading ones."""
    return head_of(msgs, keep_first_user=keep_first_user).end


def _small(gap: Sequence[Message]) -> bool:
    if len(gap) > GAP_MAX_MESSAGES:
        return False
    chars = 0
    for m in gap:
        chars += len(text_of(m))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            chars += len(str(fn.get("arguments", ""))) if isinstance(fn, dict) else 0
    return chars <= GAP_MAX_CHARS
