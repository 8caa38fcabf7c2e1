"""The report that comes with every prepared prompt: what was cut, why, and what it saved.

Keys: head {end, first_user, task, leading, messages, gap_kept, template_kept} (what was kept
as the head),
tokens_before, tokens_after, budget, trigger_tokens, target_tokens, pressure,
applied [{strategy, saved, ...}], summary {upto, prefix_hash, summarizer} | None,
dropped_groups, dropped_messages, stale (the workers could write a better summary now and it
is not here yet), changed.
"""

from __future__ import annotations

import math
from typing import Any

from shared.errors import DoesNotFit
from shared.head import Head
from shared.strategies import Limits, Work


def new_report(
    limits: Limits, trigger: float, before: int, pressure: float, head: Head
) -> dict[str, Any]:
    """The report of a prompt left as it was (prepare fills in what it then does)."""
    return {
        "head": head.describe(),
        "tokens_before": before,
        "tokens_after": before,
        "budget": limits.budget,
        "trigger_tokens": int(trigger * limits.budget),
        "target_tokens": limits.target,
        "pressure": pressure,
        "applied": [],
        "summary": None,
        "dropped_groups": 0,
        "dropped_messages": 0,
        "stale": False,
        "changed": False,
    }


def outcome(work: Work, after: int) -> dict[str, Any]:
    """What the strategies did to `work`, for the report."""
    summary = work.summary
    return {
        "tokens_after": after,
        "applied": work.applied,
        "summary": None
        if summary is None
        else {
            "upto": summary.upto,
            "prefix_hash": summary.prefix_hash,
            "summarizer": summary.summarizer,
        },
        "dropped_groups": work.dropped_groups,
        "dropped_messages": work.dropped_messages,
        "stale": work.stale,
        "changed": bool(work.applied),
    }


def does_not_fit(work: Work, after: int, floor_chars: int) -> DoesNotFit:
    """The error for a result still over budget, with what could not be cut (as it stands,
    tool outputs there shortened to `floor_chars`)."""
    work.align()
    count = work.counter.count
    kept = list(zip(work.messages, work.origin, strict=True))
    head = [m for m, o in kept if work.head.protects(o)]
    # the recent turns, with the thinking turn they start inside (kept whole)
    bound = work.bound
    tail = [m for m, o in kept if o >= bound]
    other = [m for m, o in kept if not work.head.protects(o) and o < bound]

    def scaled(tokens: int) -> int:  # as `after` is: at pressure < 1, the size assumed
        return math.ceil(tokens / work.pressure) if work.pressure != 1.0 else tokens

    return DoesNotFit(
        tokens=after,
        budget=work.limits.budget,
        head_tokens=scaled(count(head, (), work.model)),
        tail_tokens=scaled(count(tail, (), work.model)),
        tools_tokens=scaled(work.counter.count_tools(work.tools, work.model)),
        other_tokens=scaled(count(other, (), work.model)) if other else 0,
        floor_chars=floor_chars,
    )
