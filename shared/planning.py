"""Planning summaries ahead of time: which record the workers should write, and when.

The prompt is measured as prepare would build it from the best stored record
([head][summary][rest]): its *effective* tokens. Nothing is planned while they stay under
(trigger - precompute_at) x budget. Then the cut is placed so that, once the conversation
has grown to the trigger, the tail after it is about `keep_tokens_ratio` x budget. A new
record therefore lands only after the tail has grown by roughly that much again: the cut
moves in steps, and the [head][summary] prefix stays byte-stable between them (providers'
prompt caches depend on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.counting import MessageCounter
from shared.hashing import prefix_hash
from shared.messages import Message, ToolSpec
from shared.strategies import Summarize
from shared.summaries import SummaryBook, SummaryRecord
from shared.summarize import plan_cut


class Planner(Protocol):
    """What planning needs of a policy (`ContextPolicy` is one)."""

    trigger: float
    counter: MessageCounter
    summarize_params: Summarize

    def budget(self, model: str | None) -> int: ...

    def regions(self, transcript: Sequence[Message]) -> tuple[int, int]: ...

    def state(self, tokens: int, model: str | None) -> str: ...

    def with_best(
        self,
        transcript: Sequence[Message],
        book: SummaryBook | None,
        hashes: Sequence[str] | None = None,
    ) -> tuple[list[Message], SummaryRecord | None]: ...


@dataclass(frozen=True)
class SummaryPlan:
    """The record a worker should write now: transcript[start:cut], folding `previous`."""

    start: int
    cut: int
    previous: SummaryRecord | None
    prefix_hash: str


def plan_summary(
    policy: Planner,
    transcript: Sequence[Message],
    *,
    tools: Sequence[ToolSpec] = (),
    model: str | None = None,
    book: SummaryBook | None = None,
    extra_tokens: int = 0,
    hashes: Sequence[str] | None = None,
) -> SummaryPlan | None:
    """See `ContextPolicy.plan_summary`."""
    budget = policy.budget(model)
    head, tail = policy.regions(transcript)
    built, record = policy.with_best(transcript, book, hashes)
    start = record.upto if record is not None else head
    if start >= tail:  # what is left to summarize lies in the protected recent turns
        return None
    tokens = policy.counter.count(built, tools, model) + extra_tokens
    if policy.state(tokens, model) == "under":
        return None
    growth = max(0, int(policy.trigger * budget) - tokens)
    keep = max(0, int(policy.summarize_params.keep_tokens_ratio * budget) - growth)
    cut = plan_cut(
        transcript,
        start=start,
        tail_start=tail,
        counter=policy.counter,
        model=model,
        keep_tokens=keep,
    )
    if cut <= start:
        return None
    cut_hash = hashes[cut] if hashes is not None else prefix_hash(transcript[:cut])
    return SummaryPlan(start=head, cut=cut, previous=record, prefix_hash=cut_hash)
