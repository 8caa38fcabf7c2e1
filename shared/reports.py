"""The report that comes with every prepared prompt: what was cut, why, and what it saved.

Keys: tokens_before, tokens_after, budget, trigger_tokens, target_tokens, pressure,
applied [{strategy, saved, ...}], summary {upto, prefix_hash, summarizer} | None,
dropped_groups, dropped_messages, stale (a summary is due and not ready), changed.
"""

from __future__ import annotations

from typing import Any

from shared.errors import DoesNotFit
from shared.strategies import Limits, Work


def new_report(limits: Limits, trigger: float, before: int, pressure: float) -> dict[str, Any]:
    """The report of a prompt left as it was (prepare fills in what it then does)."""
    return {
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


def does_not_fit(work: Work, after: int) -> DoesNotFit:
    """The error for a result still over budget, with what could not be cut."""
    count = work.counter.count
    head = count(work.transcript[: work.head_end], (), work.model)
    kept = zip(work.messages, work.origin, strict=True)
    tail = count([m for m, o in kept if o >= work.tail_start], (), work.model)
    return DoesNotFit(
        tokens=after,
        budget=work.limits.budget,
        head_tokens=head,
        tail_tokens=tail,
        tools_tokens=work.counter.count_tools(work.tools, work.model),
    )
