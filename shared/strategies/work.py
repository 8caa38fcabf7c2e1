"""The working state one `prepare` call threads through its strategies."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.counting.calibration import ScaledCounter, scale
from shared.counting.counters import CachedCounter
from shared.counting.protocol import MessageCounter
from shared.errors import ConfigError
from shared.hashing import prefix_hashes
from shared.head import Head
from shared.messages import Message, ToolSpec, thinking_turns
from shared.strategies.origins import recover
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.summarizers import Summarizer


class SizeMemo:
    """Sizes of message objects for one call, by identity.

    Within one call messages are never mutated, so an object met before has the same size;
    the memo keeps every object it sized alive, so an id is never reused for another one.
    """

    def __init__(self) -> None:
        self._size: dict[int, int] = {}
        self._keep: list[Message] = []
        self._fixed: dict[int, int] = {}

    def total(
        self,
        base: CachedCounter,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        model: str | None,
    ) -> int:
        """Uncalibrated `base.count(messages, tools, model)`, sizing only unseen messages."""
        if not self._size:  # first measure of a call: one bulk count through the cache
            sizes: list[int | None] = list(base.message_counts(messages, model))
            self._size.update(zip(map(id, messages), sizes, strict=True))  # type: ignore[arg-type]
            self._keep.extend(messages)
        else:
            get = self._size.get
            sizes = [get(id(m)) for m in messages]
        if None in sizes:
            for i, value in enumerate(sizes):
                if value is None:
                    m = messages[i]
                    sizes[i] = self._size[id(m)] = base.count_message(m, model)
                    self._keep.append(m)
        fixed = self._fixed.get(id(tools))
        if fixed is None:
            fixed = self._fixed[id(tools)] = base.count_tools(tools, model) + base.priming
        return sum(sizes) + fixed  # type: ignore[arg-type]

    def size(self, message: Message) -> int | None:
        return self._size.get(id(message))


def measure(
    counter: MessageCounter,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    model: str | None,
    memo: SizeMemo,
) -> int:
    """`counter.count(messages, tools, model)`, through a per-call size memo when it can."""
    base, ratio = counter_parts(counter)
    if base is None:
        return counter.count(messages, tools, model)
    return scale(ratio, memo.total(base, messages, tools, model))


def counter_parts(counter: MessageCounter) -> tuple[CachedCounter | None, float]:
    """The cached base counter and calibration ratio behind `counter`, when it has them."""
    if isinstance(counter, CachedCounter):
        return counter, 1.0
    if isinstance(counter, ScaledCounter) and isinstance(counter.base, CachedCounter):
        return counter.base, counter.ratio
    return None, 1.0


@dataclass(frozen=True)
class Limits:
    """What a prepare call must achieve, in estimated tokens."""

    budget: int
    target: int
    keep_recent: int


def _always() -> bool:
    return True


# The least pressure: the estimate taken as a thousand times too small. Below it a prompt's
# assumed size leaves every integer a person reads (5e-324 makes it infinite), and no
# provider's count is that far from prefit's.
MIN_PRESSURE = 0.001


def check_pressure(pressure: float) -> None:
    """`ConfigError` unless `MIN_PRESSURE <= pressure <= 1` (NaN included)."""
    if not MIN_PRESSURE <= pressure <= 1.0:
        raise ConfigError(f"pressure must be within [{MIN_PRESSURE}, 1], got {pressure!r}")


@dataclass
class Work:
    """Messages being cut, with where each came from in the original transcript.

    `origin[i]` is the index in `transcript` of `messages[i]`, `SYNTHETIC` for prefit's own
    messages, `UNKNOWN` for one that matches nothing (see shared/strategies/origins.py). The
    head is `head` (its region `transcript[:head_end]`); the protected recent tail is
    `transcript[tail_start:]`. A strategy may replace `messages` without `origin`: the
    built-ins call `align()` first, which recovers it.
    """

    transcript: Sequence[Message]
    messages: list[Message]
    origin: list[int]
    tools: Sequence[ToolSpec]
    model: str | None
    counter: MessageCounter
    limits: Limits
    head: Head
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
    # whether the workers could write a better record now (the policy's `summary_due`)
    due: Callable[[], bool] = _always
    _hashes: list[str] | None = None
    _measured: tuple[list[Message], int, int] | None = None
    # the list `origin` was last known to describe: (list, ids, items, origin)
    _aligned: tuple[list[Message], list[int], list[Message], list[int]] | None = None
    sizes: SizeMemo = field(default_factory=SizeMemo)
    _turns: list[int] | None = None

    def inside(self) -> list[int]:
        """For each position of the transcript, the start of the thinking turn it lies
        inside, -1 for none (`shared.messages.thinking_turns`), found once per call."""
        if self._turns is None:
            self._turns = thinking_turns(self.transcript)[0]
        return self._turns

    @property
    def bound(self) -> int:
        """Where what a summary or `DropOldest` may take ends: the protected tail's start, or
        the start of the thinking turn it lies inside, which is kept whole."""
        tail = self.tail_start
        inside = self.inside()
        return inside[tail] if tail < len(inside) and inside[tail] >= 0 else tail

    @property
    def head_end(self) -> int:
        """End of the head's region (summaries cover `[head_end, upto)`)."""
        return self.head.end

    def tokens(self) -> int:
        """Estimated tokens of the current messages, scaled by 1/pressure."""
        found = self._measured
        if found is not None and found[0] is self.messages and found[1] == len(self.messages):
            return found[2]
        raw = self._count()
        value = math.ceil(raw / self.pressure) if self.pressure != 1.0 else raw
        self._measured = (self.messages, len(self.messages), value)
        return value

    def _count(self) -> int:
        """`counter.count(messages)`, re-measuring only messages this call has not seen.

        Within one call messages are never mutated, so a message object met before has the
        same size; the memo holds the object itself so its id cannot be reused.
        """
        return measure(self.counter, self.messages, self.tools, self.model, self.sizes)

    def size(self, message: Message) -> int:
        """Uncalibrated tokens of one message, from this call's memo when it was measured."""
        known = self.sizes.size(message)
        return known if known is not None else self.counter.count_message(message, self.model)

    def fits_target(self) -> bool:
        return self.tokens() <= self.limits.target

    def hashes(self) -> list[str]:
        """Prefix hashes of the original transcript, computed once per call."""
        if self._hashes is None:
            self._hashes = prefix_hashes(self.transcript)
        return self._hashes

    def use_hashes(self, hashes: Sequence[str]) -> None:
        """Take the transcript's prefix hashes from the caller (a store keeps them)."""
        self._hashes = list(hashes)

    def replace(self, messages: list[Message], origin: list[int]) -> None:
        """Swap in a new message list with the origin of each (recovered if it does not fit)."""
        self.messages = messages
        self.origin = origin
        if len(origin) == len(messages):
            self._snapshot()
        else:
            self.align()

    def align(self) -> None:
        """Make `origin` describe `messages` again after someone replaced or changed the list."""
        msgs = self.messages
        found = self._aligned
        if (
            found is not None
            and found[0] is msgs
            and len(self.origin) == len(msgs)
            and found[1] == list(map(id, msgs))
        ):
            return
        if found is None:
            known, known_origin = list(self.transcript), list(range(len(self.transcript)))
        else:
            known, known_origin = found[2], found[3]
        self.origin = recover(msgs, known, known_origin, self.transcript)
        self._snapshot()

    def _snapshot(self) -> None:
        # the items are kept too: they keep their ids from being reused by new objects
        msgs = self.messages
        self._aligned = (msgs, list(map(id, msgs)), list(msgs), list(self.origin))

    def record(self, strategy: str, before: int, **detail: Any) -> None:
        """Note that `strategy` changed the messages, saving `before - now` tokens."""
        self.applied.append({"strategy": strategy, "saved": before - self.tokens(), **detail})

    def protected(self, position: int) -> bool:
        """Whether the current message at `position` is head or protected recent tail."""
        o = self.origin[position]
        return o >= 0 and (o >= self.tail_start or self.head.protects(o))


class Strategy(Protocol):
    """Reduces `work.messages` (replacing the list) and records `work.applied` if it changed it."""

    async def apply(self, work: Work) -> None: ...
