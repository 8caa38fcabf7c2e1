"""ContextPolicy: fit a conversation into a model's input window.

A stored summary record is served as the prompt `[head][summary][rest]`: when the book's best
record brings the prompt under the trigger, `prepare` sends exactly that and cuts nothing
else, so the prompt's prefix stays byte-stable between records (the providers' prompt caches
depend on it). Planning (`plan_summary`) measures the same prompt, its *effective* tokens, to
decide when the next record is due.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from shared.counting.calibration import CalibratedCounter, ScaledCounter
from shared.counting.counters import HeuristicCounter
from shared.counting.protocol import MessageCounter, TokenCounter, per_message
from shared.cut import Ledger, Shortcut, can_decide, default_steps, grow
from shared.errors import ConfigError, DoesNotFit, UnknownModel
from shared.hashing import prefix_hash
from shared.head import Head, head_of
from shared.messages import Message, ToolSpec, groups, tail_start, validate
from shared.reports import does_not_fit, new_report, outcome
from shared.strategies import (
    ClearToolResults,
    DropOldest,
    Limits,
    Strategy,
    Summarize,
    TruncateToolResults,
    Work,
)
from shared.strategies.lastresort import FLOOR_CHARS, shed_kept, shorten_protected
from shared.strategies.summarize import INDEX_SHARE, best_record
from shared.strategies.work import SizeMemo, check_pressure, measure
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.incremental import plan_cut, summary_message
from shared.summaries.llm import LLMClient
from shared.summaries.summarizers import Summarizer, as_summarizer
from shared.validation import ValidatedPrefixes

State = Literal["under", "nearing", "over"]


@dataclass(frozen=True)
class SummaryPlan:
    """The record a worker should write now: transcript[start:cut], folding `previous`.

    - start: the head's end, where the record's range begins;
    - cut: the range's exclusive end, the record's `upto`;
    - previous: the record it extends (the new turns start at its `upto`), None for a first;
    - prefix_hash: the prefix hash of `transcript[:cut]`, the record's `prefix_hash`.
    """

    start: int
    cut: int
    previous: SummaryRecord | None
    prefix_hash: str


@dataclass
class Prepared:
    """The messages to send, and what was done to get them.

    - messages: the messages to send now;
    - report: what was done (keys in docs/design.md, "Policy semantics"); `prepare` always
      sets it;
    - new_summaries: the records this call wrote, for the caller to keep;
    - tokens_spent: the summarizer's input and output tokens this call spent;
    - cost: what those summarizer calls cost, as their `Completion`s said.
    """

    messages: list[Message]
    report: dict[str, Any] | None = None
    new_summaries: list[SummaryRecord] = field(default_factory=list)
    tokens_spent: int = 0
    cost: float = 0.0


class ContextPolicy:
    """Fit conversations into a model's input window (see docs/design.md for the semantics).

    - max_input_tokens: the model's context window, an int or a function of the model name
      (a `LookupError` from it is `UnknownModel`). Nothing here knows your model's real
      limit, so say it: a too-large number means overflow errors, a too-small one wastes
      context;
    - reserve_output: tokens kept free for the reply (4096); the budget is the window minus
      this;
    - trigger: a conversation at or under trigger x budget is sent unchanged (0.85);
    - target: over the trigger, the strategies run in order until the conversation is under
      target x budget (0.6; 0 < target <= trigger <= 1);
    - keep_recent: the last `keep_recent` turn groups after the head, the protected recent
      tail, are never summarized, cleared or dropped (3, at least 1; TruncateToolResults and
      the last resort may still shorten huge outputs and texts there);
    - strategies: run in order until the conversation is under target. The default is
      cheap-and-lossless first: TruncateToolResults(), ClearToolResults(), Summarize (which
      calls a model only when there is a summarizer; without one it serves the book's
      records), DropOldest();
    - counter: the `TokenCounter` prompts are measured with (default
      `CalibratedCounter(HeuristicCounter())`); one with only `count()` gets per-message
      sizes derived from it, and only a `CalibratedCounter` learns from `observe`;
    - summarizer: an `LLMClient` (or a `Summarizer`) that writes summaries for the Summarize
      steps that have none of their own; None: `prepare` never calls a model;
    - summarizer_model: the model the summarizer client is called with (unused with a
      `Summarizer`);
    - keep_first_user: the head keeps the user's first message and the person's task (True);
      False: the head is the leading system/developer messages only;
    - precompute_at: from (trigger - precompute_at) x budget on, `state` says "nearing"
      and `plan_summary` plans records ahead of the trigger (0.1; within [0, trigger));
    - keep_tokens_ratio, chunk_tokens, max_summary_tokens, index_share: the default
      Summarize step's settings (0.4, 24000, 1200, 0.1: see `Summarize`). `plan_summary`
      cuts with the `keep_tokens_ratio` of the first Summarize in `strategies`, else this one;
    - remembered: how many conversations' validated transcripts and measurements `prepare`
      remembers (64; see its `conversation`).
    """

    def __init__(
        self,
        max_input_tokens: int | Callable[[str | None], int],
        *,
        reserve_output: int = 4096,
        trigger: float = 0.85,
        target: float = 0.6,
        keep_recent: int = 3,
        strategies: Sequence[Strategy] | None = None,
        counter: TokenCounter | None = None,
        summarizer: LLMClient | Summarizer | None = None,
        summarizer_model: str | None = None,
        keep_first_user: bool = True,
        precompute_at: float = 0.1,
        keep_tokens_ratio: float = 0.4,
        chunk_tokens: int = 24000,
        max_summary_tokens: int = 1200,
        remembered: int = 64,
        index_share: float = INDEX_SHARE,
    ) -> None:
        _check(max_input_tokens, reserve_output, trigger, target, keep_recent, precompute_at)
        self.max_input_tokens = max_input_tokens
        self.reserve_output = reserve_output
        self.trigger = trigger
        self.target = target
        self.keep_recent = keep_recent
        self.keep_first_user = keep_first_user
        # the tenant's learned preambles (shared/store/openings.py), given per conversation
        self.preambles: frozenset[str] = frozenset()
        self.precompute_at = precompute_at
        # the transcripts prepared last and their ledgers, per conversation (`remembered`)
        self._validated: ValidatedPrefixes[Ledger] = ValidatedPrefixes(remembered)
        # a counter written from the reference may offer only count(): sizes derive from it
        self.counter: MessageCounter = (
            per_message(counter) if counter is not None else CalibratedCounter(HeuristicCounter())
        )
        self.summarizer = as_summarizer(summarizer, summarizer_model)
        default_summarize = Summarize(
            keep_tokens_ratio=keep_tokens_ratio,
            chunk_tokens=chunk_tokens,
            max_summary_tokens=max_summary_tokens,
            index_share=index_share,
        )
        self.strategies: list[Strategy] = (
            list(strategies)
            if strategies is not None
            else [TruncateToolResults(), ClearToolResults(), default_summarize, DropOldest()]
        )
        found = [s for s in self.strategies if isinstance(s, Summarize)]
        self.summarize_params: Summarize = found[0] if found else default_summarize

    def recounted(self, counter: TokenCounter) -> ContextPolicy:
        """This policy measuring with `counter`, sharing its memory of validated transcripts
        and ledgers (a ledger holds uncalibrated sizes: counters with another calibration
        ratio on the same base share it; another base builds its own)."""
        # a ScaledCounter sizes messages: skip per_message's (slow) Protocol check
        sized = counter if type(counter) is ScaledCounter else per_message(counter)
        return self._twin(counter=sized)

    def heading(self, preambles: frozenset[str]) -> ContextPolicy:
        """This policy finding heads past `preambles` (the `task_digest`s of openings the
        tenant's memory found to be preambles: shared/head.py), sharing its memory."""
        return self if preambles == self.preambles else self._twin(preambles=preambles)

    def _twin(self, **changed: Any) -> ContextPolicy:
        """A shallow copy with `changed` attributes, sharing everything else."""
        twin = object.__new__(type(self))  # copy.copy costs ten times more, per request
        twin.__dict__.update(self.__dict__, **changed)
        return twin

    # --- sizes -------------------------------------------------------------------------
    def window(self, model: str | None) -> int:
        """The model's input window, as configured."""
        if isinstance(self.max_input_tokens, int):
            return self.max_input_tokens
        try:
            found = self.max_input_tokens(model)
        except LookupError:
            raise UnknownModel(f"no input window is configured for model {model!r}") from None
        if isinstance(found, bool) or not isinstance(found, int | float) or not found < math.inf:
            raise ConfigError(f"the window of {model!r} must be a number, got {found!r}")
        window = int(found)
        if window - self.reserve_output <= 0:
            raise ConfigError(f"window {window} of {model!r} leaves nothing after reserve_output")
        return window

    def budget(self, model: str | None) -> int:
        """Tokens the prompt may use: the window minus `reserve_output`."""
        return self.window(model) - self.reserve_output

    def limits(self, model: str | None) -> Limits:
        """What a prepare call for `model` must achieve, in estimated tokens."""
        budget = self.budget(model)
        return Limits(
            budget=budget,
            target=int(self.target * budget),
            keep_recent=self.keep_recent,
        )

    def state(self, tokens: int, model: str | None) -> State:
        """Where `tokens` (effective prompt tokens) stand against the trigger."""
        budget = self.budget(model)
        if tokens > self.trigger * budget:
            return "over"
        if tokens >= (self.trigger - self.precompute_at) * budget:
            return "nearing"
        return "under"

    def head(self, transcript: Sequence[Message]) -> Head:
        """The head of `transcript`: what every prompt keeps (shared/head.py)."""
        return head_of(transcript, keep_first_user=self.keep_first_user, preambles=self.preambles)

    def regions(self, transcript: Sequence[Message]) -> tuple[int, int]:
        """(head_end, tail_start): the head's region and the protected recent tail."""
        end = self.head(transcript).end
        starts = [a for a, _ in groups(transcript, end)]
        return end, tail_start(starts, end, self.keep_recent)

    def effective_tokens(
        self,
        transcript: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        book: SummaryBook | None = None,
    ) -> int:
        """Tokens of the prompt built from the best record of `book`, before any other cut.

        - transcript, tools, model, book: as for `prepare`.
        """
        return self.counter.count(self.with_best(transcript, book)[0], tools, model)

    def with_best(
        self,
        transcript: Sequence[Message],
        book: SummaryBook | None,
        hashes: Sequence[str] | None = None,
        regions: tuple[int, int] | None = None,
        cut: Callable[[int], int] | None = None,
    ) -> tuple[list[Message], SummaryRecord | None]:
        """The prompt [head][summary][rest] from the book's best record within the protected
        tail that ends where a cut may fall (`best_record`), and that record (`regions`: the
        transcript's `regions` when the caller has them; `hashes`: its `prefix_hashes`, and
        `cut` its `cut_before`, likewise)."""
        head, tail = regions if regions is not None else self.regions(transcript)
        record = None
        if book is not None and book.records:
            record = best_record(book, transcript, upto_max=tail, hashes=hashes, cut=cut)
        if record is None or record.upto <= head:
            return list(transcript), None
        built = [*transcript[:head], summary_message(record, head), *transcript[record.upto :]]
        return built, record

    # --- the two calls of the reference ---------------------------------------------------
    async def prepare(
        self,
        transcript: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        book: SummaryBook | None = None,
        pressure: float = 1.0,
        hashes: Sequence[str] | None = None,
        conversation: Hashable | None = None,
        frozen: bool = False,
    ) -> Prepared:
        """The messages to send for `transcript`.

        A stored summary that brings the prompt under the trigger is served as
        [head][summary][rest] and nothing else is cut, so the prompt's prefix stays
        byte-stable between records. When the strategies leave it over budget, the tool
        outputs still in it (the head's and the recent turns' included) are shortened as a
        last resort; `DoesNotFit` only when even that is not enough.

        - transcript: the conversation's messages, OpenAI chat format (`InvalidTranscript`
          unless `validate` accepts them);
        - tools: the tool specs sent with them (they count in the prompt);
        - model: the model it is for: its window (when `max_input_tokens` is a function) and
          its calibration ratio;
        - book: the conversation's known summaries, reused by content hash; the records this
          call writes are added to it (and returned in `Prepared.new_summaries`);
        - pressure: < 1 assumes the real size is 1/pressure times our estimate, which forces
          deeper cuts (within [`MIN_PRESSURE`, 1]: 0.001). It is used to retry after the
          provider itself reported an overflow that our estimate missed: strategies stop as
          soon as the estimate fits, so re-running them unchanged would just produce the same
          request;
        - hashes: the transcript's `prefix_hashes` when the caller already has them (a store
          keeps them), to avoid hashing it again;
        - conversation: names it for the policy's memory of what it validated and measured (a
          store's tenant and id; by default, its opening messages): only a transcript equal
          to the one remembered, by content, reuses that work;
        - frozen: the caller promises that neither the transcript nor its messages will ever
          change (a store's snapshots), so the messages it shares, as objects, with the
          frozen transcript prepared last need not be compared again (`ValidatedPrefixes`).
        """
        check_pressure(pressure)
        measured = self._measured(transcript, tools, model, pressure, conversation, frozen)
        messages, short, sizes, before = measured
        limits = self.limits(model)
        counter = self._counter(model)
        head = self.head(messages)
        report = new_report(limits, self.trigger, before, pressure, head)
        report["window"] = limits.budget + self.reserve_output  # the one in force, for callers
        if before <= self.trigger * limits.budget:
            report.update(tokens_after=before, changed=False)
            return Prepared(messages, report)
        if hashes is not None and len(hashes) != len(messages) + 1:
            raise ConfigError(f"{len(hashes)} prefix hashes for {len(messages)} messages")
        served = self._served(
            messages,
            counter,
            tools=tools,
            model=model,
            book=book,
            hashes=hashes,
            sizes=sizes,
            report=report,
            short=short,
        )
        if served is not None:
            return Prepared(served, report)
        due = partial(
            self.summary_due, messages, tools=tools, model=model, book=book, hashes=hashes
        )
        if short is not None and head.contiguous and self._no_summary_due(book):
            kept = short.cut(
                messages, head.end, self.keep_recent, self.strategies, book is not None, report, due
            )
            if kept is not None:
                return Prepared(kept, report)
        cut = partial(
            self.cut, messages, tools=tools, model=model, book=book, pressure=pressure,
            sizes=sizes, hashes=hashes, due=due,
        )  # fmt: skip
        work = await cut()
        try:
            return self._fitted(work, report)
        except DoesNotFit:
            if work.summary is None:
                raise
        # a summary that cannot be cut made it impossible (a record written for a larger
        # window): the turns it stands for can still be cleared and dropped without it
        prepared = self._fitted(await cut(summaries=False), report)
        prepared.new_summaries[:0] = work.new_summaries
        prepared.tokens_spent += work.tokens_spent
        prepared.cost += work.cost
        return prepared

    def tokens(
        self,
        transcript: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        conversation: Hashable | None = None,
        frozen: bool = False,
    ) -> int:
        """The tokens `prepare` measures `transcript` at, at pressure 1, before cutting
        anything (it is sent as it is at or under `trigger x budget`): validated and measured
        as `prepare` does, through the conversation's ledger, so a transcript grown since the
        last one costs only its new messages, and `prepare` of it then costs nothing more.

        - transcript, tools, model, conversation, frozen: as for `prepare`.
        """
        return self._measured(transcript, tools, model, 1.0, conversation, frozen)[3]

    def _measured(
        self,
        transcript: Sequence[Message],
        tools: Sequence[ToolSpec],
        model: str | None,
        pressure: float,
        conversation: Hashable | None,
        frozen: bool,
    ) -> tuple[list[Message], Shortcut | None, SizeMemo, int]:
        """The validated messages, the ledger's shortcut (None: measure), the call's size
        memo, and the tokens before any cut (at `pressure`)."""
        steps = default_steps(self.strategies, self.counter)
        grower = partial(grow, steps) if steps is not None else None
        messages, ledger = self._validated.validate_with(
            transcript, grower, conversation, frozen=frozen
        )
        counter = self._counter(model)
        sizes = SizeMemo()
        short = Shortcut.of(steps, ledger, counter, tools, pressure)
        if short is not None:
            return messages, short, sizes, short.tokens(len(messages))
        before = math.ceil(measure(counter, messages, tools, model, sizes) / pressure)
        return messages, short, sizes, before

    async def cut(
        self,
        transcript: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        book: SummaryBook | None = None,
        pressure: float = 1.0,
        sizes: SizeMemo | None = None,
        hashes: Sequence[str] | None = None,
        due: Callable[[], bool] | None = None,
        summaries: bool = True,
    ) -> Work:
        """Run the strategies on a validated transcript; `prepare` checks the result fits.

        - transcript, tools, model, book, pressure, hashes: as for `prepare`;
        - sizes: the call's memo of message sizes (`prepare` passes the one it measured with);
        - due: answers whether the workers could write a newer record (for `stale`); by
          default `summary_due` on this transcript and book;
        - summaries: False skips the `Summarize` steps.
        """
        check_pressure(pressure)
        limits = self.limits(model)
        work = self._work(list(transcript), tools, model, book, pressure, limits)
        work.due = due or partial(
            self.summary_due, work.transcript, tools=tools, model=model, book=book
        )
        if sizes is not None:
            work.sizes = sizes
        if hashes is not None:
            work.use_hashes(hashes)
        for strategy in self.strategies:
            if not summaries and isinstance(strategy, Summarize):
                continue
            await strategy.apply(work)
            if work.fits_target():
                break
        return work

    def _fitted(self, work: Work, report: dict[str, Any]) -> Prepared:
        """What the strategies left, shortened as a last resort if it is over budget."""
        work.align()
        budget = work.limits.budget
        if work.tokens() > budget:
            shorten_protected(work, budget)
        if work.tokens() > budget:
            shed_kept(work, budget)
        after = work.tokens()
        if after > budget:
            raise does_not_fit(work, after, FLOOR_CHARS)
        report.update(outcome(work, after))
        return Prepared(work.messages, report, work.new_summaries, work.tokens_spent, work.cost)

    def observe(
        self,
        model: str | None,
        sent: Sequence[Message],
        tools: Sequence[ToolSpec],
        actual_prompt_tokens: int,
    ) -> None:
        """Calibrate on a real response (only a `CalibratedCounter` learns from it).

        Compares the provider's own prompt-token count with our raw estimate of what was sent.

        - model: the model that answered (the ratio updated is that model's);
        - sent: exactly the messages sent (`Prepared.messages`, not the transcript). It must be
          a valid, non-empty transcript (`InvalidTranscript` otherwise): the ratio of a
          request with no messages says nothing about how messages are counted;
        - tools: the tool specs sent with them;
        - actual_prompt_tokens: the provider's own prompt-token count for that request (its
          usage), a positive integer.
        """
        sent = validate(sent)
        if isinstance(self.counter, CalibratedCounter):
            estimated = self.counter.base.count(sent, tools, model)
            self.counter.observe(model, estimated, actual_prompt_tokens)

    def _served(
        self,
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
        cut = None
        if short is not None:
            head = self.head(messages).end
            regions = (head, short.tail(head, len(messages), self.keep_recent))
            cut = short.ledger.bound
        built, record = self.with_best(messages, book, hashes, regions, cut)
        if record is None:
            return None
        if short is not None and regions is not None:
            tokens = short.served(regions[0], built[regions[0]], record.upto, len(messages))
        else:
            tokens = math.ceil(measure(counter, built, tools, model, sizes) / report["pressure"])
        if tokens > self.trigger * report["budget"]:
            return None
        summary = {"upto": record.upto, "prefix_hash": record.prefix_hash}
        report.update(
            tokens_after=tokens,
            applied=[
                {"strategy": "Summarize", "saved": report["tokens_before"] - tokens, **summary}
            ],
            summary={**summary, "summarizer": record.summarizer},
            changed=True,
        )
        return built

    def _no_summary_due(self, book: SummaryBook | None) -> bool:
        """Whether no summary step can act (no record to install, no model to call)."""
        return (book is None or not book.records) and can_decide(self.strategies, self.summarizer)

    # --- ahead of time ----------------------------------------------------------------------
    def plan_summary(
        self,
        transcript: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        book: SummaryBook | None = None,
        extra_tokens: int = 0,
        hashes: Sequence[str] | None = None,
    ) -> SummaryPlan | None:
        """The record to compute now so that prepare lands under target when the trigger hits.

        The prompt is measured as prepare would build it from the best stored record: its
        effective tokens. Nothing is planned while they stay under (trigger - precompute_at)
        x budget. Then the cut is placed so that, once the conversation has grown to the
        trigger, the tail after it is about `keep_tokens_ratio` x budget. A new record
        therefore lands only after the tail has grown by roughly that much again: the cut
        moves in steps, and the [head][summary] prefix stays byte-stable between them.

        - transcript, tools, model, book: as for `prepare`;
        - extra_tokens: what requests add that `transcript` lacks (a stored conversation's
          tool specs);
        - hashes: the transcript's `prefix_hashes`, when the caller has them.
        """
        budget = self.budget(model)
        head, tail = self.regions(transcript)
        built, record = self.with_best(transcript, book, hashes, (head, tail))
        start = record.upto if record is not None else head
        if start >= tail:  # what is left to summarize lies in the protected recent turns
            return None
        tokens = self.counter.count(built, tools, model) + extra_tokens
        if self.state(tokens, model) == "under":
            return None
        growth = max(0, int(self.trigger * budget) - tokens)
        keep = max(0, int(self.summarize_params.keep_tokens_ratio * budget) - growth)
        room = max(0, self._keep_tokens(built[:head], budget, tools, model) - growth)
        cut = plan_cut(
            transcript, start=start, tail_start=tail, counter=self.counter, model=model,
            keep_tokens=room,
        )  # fmt: skip
        if room < keep and not self._worth(transcript[start:cut], record, budget, model):
            cut = plan_cut(
                transcript, start=start, tail_start=tail, counter=self.counter, model=model,
                keep_tokens=keep,
            )  # fmt: skip
        if cut <= start:
            return None
        cut_hash = hashes[cut] if hashes is not None else prefix_hash(transcript[:cut])
        return SummaryPlan(start=head, cut=cut, previous=record, prefix_hash=cut_hash)

    def _keep_tokens(
        self, head: Sequence[Message], budget: int, tools: Sequence[ToolSpec], model: str | None
    ) -> int:
        """The tail a new record leaves: `keep_tokens_ratio x budget`, less when the head and
        the largest summary would not leave that much under the target (a small window with
        a long system prompt: otherwise each record lands near the trigger, and the prompts
        after it are served stale)."""
        params = self.summarize_params
        summary = params.summary_tokens(budget) + params.index_tokens(budget)
        room = int(self.target * budget) - self.counter.count(head, tools, model) - summary
        return max(0, min(int(params.keep_tokens_ratio * budget), room))

    def _worth(
        self,
        span: Sequence[Message],
        record: SummaryRecord | None,
        budget: int,
        model: str | None,
    ) -> bool:
        """Whether folding `span` into `record` saves more than the summary could grow by
        (else a large head with a small rest would be summarized into no smaller a prompt)."""
        params = self.summarize_params
        largest = params.summary_tokens(budget) + params.index_tokens(budget)
        grows = largest - (record.tokens if record is not None else 0)
        return sum(self.counter.count_message(m, model) for m in span) >= grows

    def summary_due(self, transcript: Sequence[Message], **plan: Any) -> bool:
        """Whether the workers could write a better record now: `plan_summary(transcript,
        **plan)` has one. `report["stale"]` requires it, so a conversation with nothing left
        to summarize outside the protected recent turns is never waited on nor asked for."""
        return self.plan_summary(transcript, **plan) is not None

    # --- helpers ----------------------------------------------------------------------------
    def _work(
        self,
        messages: list[Message],
        tools: Sequence[ToolSpec],
        model: str | None,
        book: SummaryBook | None,
        pressure: float,
        limits: Limits,
    ) -> Work:
        head = self.head(messages)
        _, tail = self.regions(messages)
        work = Work(
            transcript=messages,
            messages=list(messages),
            origin=list(range(len(messages))),
            tools=tools,
            model=model,
            counter=self._counter(model),
            limits=limits,
            head=head,
            tail_start=tail,
            pressure=pressure,
            book=book,
            summarizer=self.summarizer,
        )
        work.replace(work.messages, work.origin)  # what `origin` describes, for `align`
        return work

    def _counter(self, model: str | None) -> MessageCounter:
        """The counter for one call: a calibrated one reads its (maybe remote) ratio once."""
        if isinstance(self.counter, CalibratedCounter):
            return self.counter.scaled(model)
        return self.counter


def _check(
    window: int | Callable[[str | None], int],
    reserve_output: int,
    trigger: float,
    target: float,
    keep_recent: int,
    precompute_at: float,
) -> None:
    if isinstance(window, bool) or not (isinstance(window, int) or callable(window)):
        raise ConfigError(
            f"max_input_tokens must be an int or a function of the model, got {window!r}"
        )
    if not 0.0 < target <= trigger <= 1.0:
        raise ConfigError(f"need 0 < target <= trigger <= 1, got target={target} trigger={trigger}")
    if reserve_output < 0 or keep_recent < 1:
        raise ConfigError("reserve_output must be >= 0 and keep_recent >= 1")
    if not 0.0 <= precompute_at < trigger:
        raise ConfigError(f"precompute_at must be within [0, trigger), got {precompute_at}")
    if isinstance(window, int) and window - reserve_output <= 0:
        raise ConfigError(
            f"max_input_tokens ({window}) must exceed reserve_output ({reserve_output})"
        )
