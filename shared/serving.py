"""Serving a stored summary record: the prompt `[head][summary][rest]`, and when it suffices.

When the book's best record brings the prompt under the trigger, `prepare` sends exactly
that and cuts nothing else, so the prompt's prefix stays byte-stable between records (the
providers' prompt caches depend on it). Planning measures the same prompt (its *effective*
tokens) to decide when the next record is due.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from shared.counting import MessageCounter
from shared.head import Head
from shared.messages import Message, ToolSpec
from shared.strategies.work import SizeMemo, measure
from shared.summaries import SummaryBook, SummaryRecord
from shared.summarize import summary_message

if TYPE_CHECKING:
    from shared.cut import Shortcut


class Regions(Protocol):
    """What serving a record needs of a policy (`ContextPolicy` is one)."""

    trigger: float
    keep_recent: int

    def head(self, transcript: Sequence[Message]) -> Head: ...

    def regions(self, transcript: Sequence[Message]) -> tuple[int, int]: ...


def with_best(
    policy: Regions,
    transcript: Sequence[Message],
    book: SummaryBook | None,
    hashes: Sequence[str] | None = None,
    regions: tuple[int, int] | None = None,
) -> tuple[list[Message], SummaryRecord | None]:
    """The prompt built from `book`'s best record within the protected tail, and the record
    (`regions`: the transcript's `policy.regions` when the caller has them)."""
    head, tail = regions if regions is not None else policy.regions(transcript)
    record = None
    if book is not None and book.records:
        record = book.best(transcript, upto_max=tail, hashes=hashes)
    if record is None or record.upto <= head:
        return list(transcript), None
    built = [*transcript[:head], summary_message(record, head), *transcript[record.upto :]]
    return built, record


def from_book(
    policy: Regions,
    messages: list[Message],
    counter: MessageCounter,
    *,
    tools: Sequence[ToolSpec],
    model: str | None,
    book: SummaryBook | None,
    hashes: Sequence[str] | None,
    sizes: SizeMemo,
    report: dict[str, Any],
    short: Shortcut | None = None,
) -> list[Message] | None:
    """[head][summary][rest] from the book's best record, if that is under the trigger
    (`report` then says so); None otherwise. With the conversation's ledger (`short`) the
    regions and the prompt's size come from its sums instead of a pass over the messages."""
    if book is None or not book.records:
        return None
    regions = None
    if short is not None:
        head = policy.head(messages).end
        regions = (head, short.tail(head, len(messages), policy.keep_recent))
    built, record = with_best(policy, messages, book, hashes, regions)
    if record is None:
        return None
    if short is not None and regions is not None:
        tokens = short.served(regions[0], built[regions[0]], record.upto, len(messages))
    else:
        tokens = math.ceil(measure(counter, built, tools, model, sizes) / report["pressure"])
    if tokens > policy.trigger * report["budget"]:
        return None
    summary = {"upto": record.upto, "prefix_hash": record.prefix_hash}
    report.update(
        tokens_after=tokens,
        applied=[{"strategy": "Summarize", "saved": report["tokens_before"] - tokens, **summary}],
        summary={**summary, "summarizer": record.summarizer},
        changed=True,
    )
    return built
