"""Summarize: replace the oldest turns with a summary, kept as [head] [summary] [recent tail]."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from shared.errors import ConfigError
from shared.logs import get_logger
from shared.messages import Message, cut_before
from shared.strategies.clear import ClearToolResults
from shared.strategies.origins import SYNTHETIC
from shared.strategies.work import Work
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.incremental import build_record, plan_cut, summary_message
from shared.summaries.llm import LLMClient, SummarizeFn
from shared.summaries.summarizers import FnSummarizer, LLMSummarizer, Summarizer

log = get_logger(__name__)

# the artifact index's share of the budget (bench/artifacts.py measured 0.05-0.2: see
# docs/benchmarks.md, "What the agent still knows")
INDEX_SHARE = 0.1
# the most of the budget the summarizer's text may take: `max_summary_tokens` caps it, and a
# small window (8k: a 3.9k budget) would otherwise give a third of itself to the narrative
SUMMARY_SHARE = 0.2


class Summarize:
    """Replace the oldest turns with a model-written, incremental summary.

    It first reuses the best record of the book (matched by content hash), then, when that is
    not enough and a summarizer is at hand (its own `client`/`summarize`, else the policy's),
    folds the newer turns into it chunk by chunk. Without any summarizer it never calls a
    model: it serves the book's record and marks the result `stale` if more is due. When the
    summarizer fails (a provider's rate limit, a timeout), the record it had is used, the
    result is marked `stale`, and the strategies after it cut instead: the request goes on.

    - client: the `LLMClient` that writes the summaries (a plain call on `client`/`model`);
      None, and no `summarize`: the policy's summarizer;
    - model: the model `client` (or `summarize`) is called with;
    - keep_tokens_ratio: where the summary ends: the turns left after it come to at most
      keep_tokens_ratio x budget (0.4, within (0, 1)), the protected recent tail whatever
      its size;
    - chunk_tokens: the most tokens of messages one summarizer call takes (24000); a longer
      range is folded in chunk by chunk (a larger turn group goes alone);
    - max_summary_tokens: the `max_tokens` of each summarizer call, the summary's size
      cap (1200);
    - summarize: an async `(prompt, model) -> summary text` to use instead of `client`
      (it wins when both are given);
    - index_share: the share of the budget the artifact index served after the summary may
      take (0.1, within [0, 0.5]; 0: kept in the record, not shown): the summarizer's text
      keeps `max_summary_tokens`, the index is budgeted by the window it is served in.
    """

    def __init__(
        self,
        client: LLMClient | None = None,
        model: str | None = None,
        *,
        keep_tokens_ratio: float = 0.4,
        chunk_tokens: int = 24000,
        max_summary_tokens: int = 1200,
        summarize: SummarizeFn | None = None,
        index_share: float = INDEX_SHARE,
    ) -> None:
        if not 0.0 < keep_tokens_ratio < 1.0:
            raise ConfigError(f"keep_tokens_ratio must be within (0, 1), got {keep_tokens_ratio}")
        if chunk_tokens <= 0 or max_summary_tokens <= 0:
            raise ConfigError("chunk_tokens and max_summary_tokens must be positive")
        if not 0.0 <= index_share <= 0.5:
            raise ConfigError(f"index_share must be within [0, 0.5], got {index_share}")
        self.index_share = index_share
        self.keep_tokens_ratio = keep_tokens_ratio
        self.chunk_tokens = chunk_tokens
        self.max_summary_tokens = max_summary_tokens
        self._own: Summarizer | None = None
        if summarize is not None:
            self._own = FnSummarizer(summarize, model)
        elif client is not None:
            self._own = LLMSummarizer(client, model)

    def __repr__(self) -> str:
        return f"Summarize(keep_tokens_ratio={self.keep_tokens_ratio})"

    def summary_tokens(self, budget: int) -> int:
        """The summarizer's `max_tokens` for a summary served within `budget`."""
        return max(1, min(self.max_summary_tokens, int(SUMMARY_SHARE * budget)))

    def index_tokens(self, budget: int) -> int:
        """The artifact index's tokens in a summary served within `budget`."""
        return int(self.index_share * budget)

    @property
    def summarizer(self) -> Summarizer | None:
        """Its own summarizer (from `client` or `summarize`), if it was given one."""
        return self._own

    async def apply(self, work: Work) -> None:
        work.align()
        if work.bound <= work.head_end:
            return
        before = work.tokens()
        record = None
        if work.book is not None:
            record = best_record(
                work.book, work.transcript, upto_max=work.bound, hashes=work.hashes()
            )
        if record is not None and record.upto <= work.head_end:
            record = None
        summarizer = self._own or work.summarizer
        failed = False
        if summarizer is not None and (record is None or not self._fits_with(work, record)):
            try:
                record = await self._extend(work, summarizer, record) or record
            except Exception as exc:  # a provider's 429 or timeout must not fail the request
                log.warning(
                    "summarize.failed", error=type(exc).__name__, summarizer=summarizer.name
                )
                failed = True  # the strategies after this one cut without a new summary
        # stale: a summary is due that the workers could write now, and it is not here
        work.stale = failed or (summarizer is None and work.book is not None and work.due())
        if record is None:
            return
        self._install(work, record)
        work.summary = record
        work.record("Summarize", before, upto=record.upto, prefix_hash=record.prefix_hash)
        if not work.fits_target():
            # what the summary does not hold (the agent's findings since) is worth more than
            # old tool outputs, whose calls stay: clear those before anything is dropped
            await ClearToolResults(keep_last=0).apply(work)

    @staticmethod
    def _fits_with(work: Work, record: SummaryRecord) -> bool:
        messages, _ = _installed(work, record)
        raw = work.counter.count(messages, work.tools, work.model)
        return raw / work.pressure <= work.limits.target

    async def _extend(
        self, work: Work, summarizer: Summarizer, previous: SummaryRecord | None
    ) -> SummaryRecord | None:
        start = previous.upto if previous is not None else work.head_end
        cut = plan_cut(
            work.transcript,
            start=start,
            tail_start=work.tail_start,
            counter=work.counter,
            model=work.model,
            keep_tokens=int(self.keep_tokens_ratio * work.limits.budget),
        )
        if cut <= start:
            return None
        built = await build_record(
            work.transcript,
            start=work.head_end,
            cut=cut,
            previous=previous,
            summarizer=summarizer,
            counter=work.counter,
            model=work.model,
            chunk_tokens=self.chunk_tokens,
            max_summary_tokens=self.summary_tokens(work.limits.budget),
            hashes=work.hashes(),
            index_tokens=self.index_tokens(work.limits.budget),
        )
        work.new_summaries.append(built.record)
        work.tokens_spent += built.input_tokens + built.output_tokens
        work.cost += built.cost
        if work.book is not None:
            work.book.add(built.record)
        return built.record

    @staticmethod
    def _install(work: Work, record: SummaryRecord) -> None:
        work.replace(*_installed(work, record))


def best_record(
    book: SummaryBook,
    transcript: Sequence[Message],
    *,
    upto_max: int,
    hashes: Sequence[str] | None = None,
    cut: Callable[[int], int] | None = None,
) -> SummaryRecord | None:
    """The book's best record reaching at most `upto_max` and ending where a cut may fall.

    A record ending inside a thinking turn (shared/messages.py: written before the rule, or
    found for another conversation with the same prefix) would leave the turn's later
    steps without its start: the next shorter record is taken instead.

    - cut: `cut_before` on `transcript` (a ledger's `bound` when the caller has one).
    """
    at = cut if cut is not None else partial(cut_before, transcript)
    limit = at(upto_max)
    while True:
        record = book.best(transcript, upto_max=limit, hashes=hashes)
        if record is None or at(record.upto) == record.upto:
            return record
        limit = record.upto - 1


def _installed(work: Work, record: SummaryRecord) -> tuple[list[Message], list[int]]:
    """The messages with what stands for `transcript[head_end:upto]` replaced by the summary:
    everything after the head's region and before the first message from `upto` on (earlier
    summaries and drop markers there included)."""
    origin = work.origin
    start = 1 + max((p for p, o in enumerate(origin) if 0 <= o < work.head_end), default=-1)
    stop = next((p for p, o in enumerate(origin) if o >= record.upto), len(origin))
    stop = max(start, stop)
    if stop == start:
        return work.messages, origin
    summary = summary_message(record, work.head_end)
    messages = [*work.messages[:start], summary, *work.messages[stop:]]
    return messages, [*origin[:start], SYNTHETIC, *origin[stop:]]
