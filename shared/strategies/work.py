"""The working state one `prepare` call threads through its strategies."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.counters import TokenCounter
from shared.hashing import prefix_hashes
from shared.messages import Message, ToolSpec
from shared.summaries import SummaryBook, SummaryRecord
from shared.summarizers import Summarizer

SYNTHETIC = -1  # origin of a message prefit wrote (summary, drop marker)


@dataclass(frozen=True)
class Limits:
    """What a prepare call must achieve, in estimated tokens."""

    budget: int
    target: int
    keep_recent: int
    chunk_tokens: int
    max_summary_tokens: int


@dataclass
class Work:
    """Messages being cut, with where each came from in the original transcript.

    `origin[i]` is the index in `transcript` of `messages[i]` (or `SYNTHETIC`). The head is
    `transcript[:head_end]`; the protected recent tail is `transcript[tail_start:]`.
    """

    transcript: Sequence[Message]
    messages: list[Message]
    origin: list[int]
    tools: Sequence[ToolSpec]
    model: str | None
    counter: TokenCounter
    limits: Limits
    head_end: int
    tail_start: int
    pressure: float = 1.0
    book: SummaryBook | None = None
    summarizer: Summarizer | None = None
    applied: list[dict[str, Any]] = field(default_factory=list)
    summary: SummaryRecord | None = None
    dropped_groups: int = 0
    dropped_messages: int = 0
    stale: bool = False
    new_summaries: list[SummaryRecord] = field(default_factory=list)
    tokens_spent: int = 0
    cost: float = 0.0
    _hashes: list[str] | None = None

    def tokens(self) -> int:
        """Estimated tokens of the current messages, scaled by 1/pressure."""
        raw = self.counter.count(self.messages, self.tools, self.model)
        return math.ceil(raw / self.pressure) if self.pressure != 1.0 else raw

    def fits_target(self) -> bool:
        return self.tokens() <= self.limits.target

    def hashes(self) -> list[str]:
        """Prefix hashes of the original transcript, computed once per call."""
        if self._hashes is None:
            self._hashes = prefix_hashes(self.transcript)
        return self._hashes

    def replace(self, messages: list[Message], origin: list[int]) -> None:
        """Swap in a new message list (strategies never mutate messages in place)."""
        if len(messages) != len(origin):
            raise AssertionError("messages and origin must stay aligned")
        self.messages = messages
        self.origin = origin

    def record(self, strategy: str, before: int, **detail: Any) -> None:
        """Note that `strategy` changed the messages, saving `before - now` tokens."""
        self.applied.append({"strategy": strategy, "saved": before - self.tokens(), **detail})

    def protected(self, position: int) -> bool:
        """Whether the current message at `position` is head or protected recent tail."""
        o = self.origin[position]
        return o != SYNTHETIC and (o < self.head_end or o >= self.tail_start)


class Strategy(Protocol):
    """Reduces `work.messages` (replacing the list) and records `work.applied` if it changed it."""

    async def apply(self, work: Work) -> None: ...
