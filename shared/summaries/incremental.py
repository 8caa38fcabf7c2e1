"""Incremental summaries: where to cut, and how to fold a range into the previous record.

Used inline by the `Summarize` strategy and ahead of time by the summary workers, so both
produce the same records for the same transcript.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from shared.counting.protocol import MessageCounter
from shared.errors import ConfigError, ContextLengthExceeded, RangeTooLong
from shared.hashing import prefix_hashes
from shared.messages import Message, groups, thinking_turns
from shared.summaries.artifacts import INDEX_CHARS_PER_TOKEN, ArtifactIndex, narrative
from shared.summaries.book import SummaryRecord
from shared.summaries.summarizers import Summarizer


@dataclass(frozen=True)
class Built:
    """A record just written, with what writing it cost."""

    record: SummaryRecord
    input_tokens: int
    output_tokens: int
    cost: float
    calls: int


def summary_message(record: SummaryRecord, start: int) -> Message:
    """The message that stands for `transcript[start:record.upto]`; byte-stable per record.

    `upto` is an exclusive end, as in the reference (`T[head_end:upto]`); the text numbers
    messages as a person counts them, from 1 and inclusive, so that range reads "messages
    start + 1 to upto" (a record with `upto` 112 after a one-message head: "2 to 112").
    """
    return {
        "role": "user",
        "content": (
            f"[Summary of messages {start + 1} to {record.upto} of this conversation, "
            f"which were removed to save context]\n{record.text}"
        ),
    }


def plan_cut(
    transcript: Sequence[Message],
    *,
    start: int,
    tail_start: int,
    counter: MessageCounter,
    model: str | None,
    keep_tokens: int,
) -> int:
    """The earliest group boundary in [start, tail_start] whose suffix fits in `keep_tokens`,
    and none inside a thinking turn (shared/messages.py: a summary takes one whole or not).

    Everything before the cut gets summarized; the protected tail (from `tail_start`) is
    always kept, even when it alone exceeds `keep_tokens`, and so is the thinking turn it
    starts inside.
    """
    inside = thinking_turns(transcript)[0]
    end = tail_start
    if end < len(inside) and inside[end] >= 0:
        end = inside[end]
    bounds = [a for a, _ in groups(transcript, start) if inside[a] < 0]
    suffix = sum(counter.count_message(m, model) for m in transcript[end:])
    cut = end
    for a in reversed([b for b in bounds if b < end]):
        size = sum(counter.count_message(m, model) for m in transcript[a:cut])
        if suffix + size > keep_tokens:
            break
        suffix += size
        cut = a
    return max(start, cut)


def _chunks(
    transcript: Sequence[Message],
    start: int,
    cut: int,
    counter: MessageCounter,
    model: str | None,
    chunk_tokens: int,
) -> deque[tuple[int, int]]:
    """Group-aligned ranges of [start, cut), each within `chunk_tokens` (bar one huge group)."""
    out: deque[tuple[int, int]] = deque()
    lo, size = start, 0
    for a, b in groups(transcript[:cut], start):
        g = sum(counter.count_message(m, model) for m in transcript[a:b])
        if size and size + g > chunk_tokens:
            out.append((lo, a))
            lo, size = a, 0
        size += g
    if lo < cut:
        out.append((lo, cut))
    return out


def _halve(transcript: Sequence[Message], a: int, b: int) -> tuple[tuple[int, int], ...] | None:
    bounds = [x for x, _ in groups(transcript[:b], a)]
    if len(bounds) < 2:
        return None
    mid = bounds[len(bounds) // 2]
    return (a, mid), (mid, b)


def _too_long(
    group: Sequence[Message],
    bounds: tuple[int, int],
    counter: MessageCounter,
    model: str | None,
    chunk_tokens: int,
    exc: ContextLengthExceeded,
) -> NoReturn:
    """A single turn group was refused as too long: whose fault is it?

    Larger than `chunk_tokens`: this conversation's (`RangeTooLong`; other ranges are fine).
    Within it: the summarizer cannot take the chunks it is configured for (the error as is).
    """
    size = sum(counter.count_message(m, model) for m in group)
    if size > chunk_tokens:
        raise RangeTooLong(
            f"messages [{bounds[0]}, {bounds[1]}) are one turn group of about {size} tokens, "
            f"over chunk_tokens ({chunk_tokens}), and the summarizer refused them as too long",
            status=exc.status,
        ) from exc
    raise exc


async def build_record(
    transcript: Sequence[Message],
    *,
    start: int,
    cut: int,
    previous: SummaryRecord | None,
    summarizer: Summarizer,
    counter: MessageCounter,
    model: str | None,
    chunk_tokens: int,
    max_summary_tokens: int,
    hashes: Sequence[str] | None = None,
    now: float | None = None,
    index_tokens: int = 0,
) -> Built:
    """Summarize `transcript[start:cut]` (folding `previous`, which must end in [start, cut)).

    Long ranges go chunk by chunk; a chunk the provider finds too long is halved and retried.
    The range's artifact index is folded into the previous record's (no model), shown to the
    summarizer with each chunk (in at most `max_summary_tokens`), and rendered after the
    summary's text in `index_tokens`.

    - summarizer: what writes the summary;
    - counter, model: size the chunks and the record's `tokens`;
    - chunk_tokens, max_summary_tokens: as for `Summarize`;
    - hashes: the transcript's `prefix_hashes` when the caller has them;
    - now: the record's `created_at` (None: the current time);
    - index_tokens: the rendered index's share of the summary (0: kept, not shown).
    """
    begin = previous.upto if previous is not None else start
    if not start <= begin < cut <= len(transcript):
        raise ConfigError(f"bad summary range [{begin}, {cut}) for {len(transcript)} messages")
    text = narrative(previous.text) if previous is not None else None
    index = (previous.artifacts if previous is not None else None) or ArtifactIndex()
    pending = _chunks(transcript, begin, cut, counter, model, chunk_tokens)
    spent_in = spent_out = calls = 0
    cost = 0.0
    while pending:
        a, b = pending.popleft()
        calls += 1
        chunk_index = index.fold(transcript[a:b], a)
        # the summarizer needs names to refer to, not the whole index: at most its own
        # output's size, so the prompt grows by no more than the summary it asks for
        prompt_tokens = min(index_tokens, max_summary_tokens)
        shown = chunk_index.render(prompt_tokens * INDEX_CHARS_PER_TOKEN) if prompt_tokens else ""
        try:
            done = await summarizer.summarize(
                text, transcript[a:b], max_tokens=max_summary_tokens, index=shown
            )
        except ContextLengthExceeded as exc:
            halves = _halve(transcript, a, b)
            if halves is None:
                _too_long(transcript[a:b], (a, b), counter, model, chunk_tokens, exc)
            pending.extendleft(reversed(halves))
            continue
        text, index = done.text, chunk_index
        spent_in, spent_out = spent_in + done.input_tokens, spent_out + done.output_tokens
        cost += done.cost
    chain = hashes if hashes is not None else prefix_hashes(transcript[:cut])
    text = text or ""
    rendered = index.render(index_tokens * INDEX_CHARS_PER_TOKEN, shown=text)
    if rendered:
        text = f"{text}\n\n{rendered}"
    provisional = SummaryRecord(upto=cut, prefix_hash=chain[cut], text=text)
    record = SummaryRecord(
        upto=cut,
        prefix_hash=chain[cut],
        text=text,
        summarizer=summarizer.name,
        tokens=counter.count_message(summary_message(provisional, start), model),
        created_at=time.time() if now is None else now,
        artifacts=index,
    )
    return Built(record, spent_in, spent_out, cost, calls)
