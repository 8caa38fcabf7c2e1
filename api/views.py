"""The end of a stored conversation, as much as an append needs, read in O(recent turns).

An append must validate its messages against the last stored turn group (tool pairing),
know where the head ends and where the protected recent tail starts (to find the summary
record prepare would use), and know the conversation's token total. `read_view` gets all of
that from the tip: the last messages, widened until they hold enough turn groups, plus the
running tally. Only when the tally is missing or out of date (first use, a lost race, a
crash between the two writes) does it read and count the whole conversation, once, and
store the tally again. Sync code: the API runs it in its threadpool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from shared.counting.protocol import MessageCounter
from shared.head import head_end, head_of
from shared.messages import Message
from shared.store.tally import Tally, Tip

TAIL_READ = 32  # messages read from the end at first; doubled while too few turn groups


@dataclass(frozen=True)
class View:
    """Messages [offset, length) of a stored conversation, with its head and token total."""

    exists: bool
    window: list[Message]
    offset: int
    length: int
    last_hash: str
    head_end: int
    total: int  # base (uncalibrated) tokens of all `length` messages
    model: str | None
    bound: bool = True  # an append must be checked against the exact tip (shared/store/writes.py)

    @property
    def last(self) -> Message | None:
        return self.window[-1] if self.window else None


def group_starts(window: Sequence[Message], offset: int, head: int) -> list[int]:
    """Indices where turn groups start (every non-tool message) at or after the head."""
    return [
        offset + i for i, m in enumerate(window) if offset + i >= head and m.get("role") != "tool"
    ]


def known_tail_start(
    window: Sequence[Message], offset: int, head: int, keep_recent: int
) -> int | None:
    """Start of the protected recent tail (as `ContextPolicy.regions`); None if unknowable."""
    starts = group_starts(window, offset, head)
    if len(starts) >= keep_recent:
        return starts[-keep_recent]
    return head if offset <= head else None


def kept_head_end(messages: Sequence[Message], length: int) -> int:
    """The head end a tally keeps: the head's end once the task (first user message) is in,
    else `length`, which makes the next reader recount the head (it can still move)."""
    head = head_of(messages)
    return head.end if head.final else length


def context_start(window: Sequence[Message]) -> int | None:
    """Index in `window` of the last turn group's first message; None if not in the window."""
    for i in range(len(window) - 1, -1, -1):
        if window[i].get("role") != "tool":
            return i
    return None


def is_bound(window: Sequence[Message], offset: int) -> bool:
    """Whether an append after `window` (a conversation's last messages, from `offset`) must
    be checked against this exact tip: its last turn group has tool calls not yet answered,
    or no user message has come yet (the head, which ends after it, may still grow)."""
    if offset == 0 and not head_of(window).final:
        return True
    start = context_start(window)
    if start is None:  # the last turn group starts before the window: cannot tell
        return True
    calls = window[start].get("tool_calls") if window[start].get("role") == "assistant" else None
    if not calls:
        return False
    answered = {m.get("tool_call_id") for m in window[start + 1 :]}
    return any(isinstance(c, dict) and c.get("id") not in answered for c in calls)


def read_view(
    tally: Tally,
    tenant: str,
    conv_id: str,
    *,
    counter: MessageCounter,
    counter_id: str,
    keep_recent: int,
) -> View:
    """The conversation's tip, widened to `keep_recent` turn groups, with its token total."""
    tip = tally.tip(tenant, conv_id, counter=counter_id, tail=TAIL_READ)
    if not tip.exists:
        return View(False, [], 0, 0, tip.last_hash, 0, 0, None, bound=True)
    if tip.total is None or tip.head_end is None or tip.head_end >= tip.length:
        return rebuild(tally, tenant, conv_id, tip, counter=counter, counter_id=counter_id)
    window, offset = tip.tail, tip.tail_offset
    while offset > 0 and not _enough(window, offset, tip.head_end, keep_recent):
        start = max(0, offset - max(len(window), TAIL_READ))
        window = tally.read(tenant, conv_id, start=start, stop=offset) + window
        offset = start
    return View(
        True,
        window,
        offset,
        tip.length,
        tip.last_hash,
        tip.head_end,
        tip.total,
        tip.model,
        bound=tip.bound,
    )


def rebuild(
    tally: Tally, tenant: str, conv_id: str, tip: Tip, *, counter: MessageCounter, counter_id: str
) -> View:
    """Read and count every message, store the tally again, and view the whole conversation."""
    messages = tally.read(tenant, conv_id, start=0, stop=tip.length)
    cumulative = list(accumulate(counter.count_message(m) for m in messages))
    head = head_end(messages)
    tally.rebuild(
        tenant,
        conv_id,
        counter=counter_id,
        last_hash=tip.last_hash,
        head_end=kept_head_end(messages, len(messages)),
        cumulative=cumulative,
    )
    total = cumulative[-1] if cumulative else 0
    return View(
        True, messages, 0, len(messages), tip.last_hash, head, total, tip.model, bound=tip.bound
    )


def _enough(window: Sequence[Message], offset: int, head: int, keep_recent: int) -> bool:
    return (
        len(group_starts(window, offset, head)) >= keep_recent and context_start(window) is not None
    )
