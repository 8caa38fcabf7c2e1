"""Stored conversations: append, replace, describe, delete (sync: run in the threadpool).

An append costs O(new messages + recent turn groups), never O(conversation): it validates the
new messages against the last stored group, counts only them, extends the running tally, and
measures the effective tokens (head + best summary + rest) from three tally reads. When
those near the trigger it asks the workers for the next summary, once per state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from api.deps import Services
from api.enqueue import Claim, size_step
from api.payloads import incoming, incoming_tools, validate_appended
from api.policies import Window, make_policy
from api.schemas import AppendRequest, ConversationInfo, ReplaceRequest, SummaryInfo
from api.views import View, context_start, kept_head_end, read_view, tail_start
from shared.calibration import ScaledCounter, scale
from shared.errors import InvalidTranscript, LengthMismatch, NotFound, StoreUnavailable
from shared.head import head_end
from shared.jobs import SummaryJob
from shared.logs import get_logger
from shared.messages import ToolSpec, validate
from shared.policy import State
from shared.store.chain import EMPTY, extend_chain
from shared.summaries import SummaryRecord
from shared.summarize import summary_message

log = get_logger(__name__)

RACE_ATTEMPTS = 8  # appends without expected_length retry when another writer got in first

# (upto, head) -> base tokens of the first `upto` and of the first `head` messages
Cum = Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Sizes:
    """A stored conversation's size now, and where it stands against the trigger."""

    length: int
    tokens: int
    effective_tokens: int
    state: State
    best: SummaryRecord | None
    claim: Claim | None = None  # a summary job to send once the answer is out


class Conversations:
    """The conversation routes' logic, on the app's services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.base = svc.base

    def _view(self, tenant: str, conv_id: str) -> View:
        """The conversation's tip and token total, as `read_view` reads it for this service."""
        return read_view(
            self.svc.tally,
            tenant,
            conv_id,
            counter=self.base,
            counter_id=self.svc.counter_id,
            keep_recent=self.svc.settings.keep_recent,
        )

    # --- writes --------------------------------------------------------------------------
    def append(self, tenant: str, conv_id: str, req: AppendRequest, window: Window) -> Sizes:
        for _ in range(RACE_ATTEMPTS):
            view = self._view(tenant, conv_id)
            if req.expected_length is not None and view.length != req.expected_length:
                raise LengthMismatch(req.expected_length, view.length)
            if req.system is not None and view.length:
                raise InvalidTranscript(
                    "'system' can only be given when the conversation is "
                    "created; replace it (PUT) to change it"
                )
            new = incoming(req.messages, format=req.format, system=req.system, previous=view.last)
            start = context_start(view.window) or 0
            validate_appended(view.window[start:], new, format=req.format)
            cumulative = list(
                accumulate((self.base.count_message(m) for m in new), initial=view.total)
            )
            try:
                length = self.svc.store.conversations.append(
                    tenant,
                    conv_id,
                    new,
                    expected_length=view.length,
                    model=window.model,
                    tokens=cumulative[-1],
                )
            except LengthMismatch:
                if req.expected_length is not None:
                    raise
                continue  # another writer appended since the view was read: read again
            break
        else:
            raise StoreUnavailable(f"append kept racing other writers ({RACE_ATTEMPTS} attempts)")
        full = [*view.window, *new]
        head = head_end(full) if view.offset == 0 else view.head_end
        # the first user message may still be to come: then store a head end the next
        # reader recounts from (see `views.kept_head_end`)
        kept_head = kept_head_end(full, length) if view.offset == 0 else head
        tail = tail_start(full, view.offset, head, self.svc.settings.keep_recent) or head
        new_hash = extend_chain(view.last_hash, new)[-1] if new else view.last_hash
        ext = self.svc.tally.extend(
            tenant,
            conv_id,
            counter=self.svc.counter_id,
            old_hash=view.last_hash,
            old_length=view.length,
            new_hash=new_hash,
            head_end=kept_head,
            cumulative=cumulative[1:],
            upto_max=tail,
        )
        self.svc.cache.appended(
            tenant, conv_id, old_length=view.length, old_hash=view.last_hash, messages=new
        )
        known: Cum = lambda upto, head: (ext.tokens_upto, ext.tokens_head)  # noqa: E731
        return self._measure(
            tenant,
            conv_id,
            window,
            length=length,
            last_hash=new_hash,
            total=cumulative[-1],
            head=head,
            best=ext.best,
            cum=known if ext.extended else self._recount(tenant, conv_id),
            tools=incoming_tools(req.tools, format=req.format),
        )

    def replace(self, tenant: str, conv_id: str, req: ReplaceRequest, window: Window) -> Sizes:
        messages = validate(incoming(req.messages, format=req.format, system=req.system))
        cumulative = list(accumulate((self.base.count_message(m) for m in messages), initial=0))
        length = self.svc.store.conversations.replace(
            tenant,
            conv_id,
            messages,
            expected_length=req.expected_length,
            model=window.model,
            tokens=cumulative[-1],
        )
        self.svc.cache.drop(tenant, conv_id)
        head = head_end(messages)
        last_hash = extend_chain(EMPTY, messages)[-1] if messages else EMPTY
        self.svc.tally.rebuild(
            tenant,
            conv_id,
            counter=self.svc.counter_id,
            last_hash=last_hash,
            head_end=kept_head_end(messages, length),
            cumulative=cumulative[1:],
        )
        tail = tail_start(messages, 0, head, self.svc.settings.keep_recent) or head
        return self._measure(
            tenant,
            conv_id,
            window,
            length=length,
            last_hash=last_hash,
            total=cumulative[-1],
            head=head,
            best=self.svc.store.records.best(tenant, conv_id, upto_max=tail),
            cum=lambda upto, head: (cumulative[upto], cumulative[head]),
            tools=incoming_tools(req.tools, format=req.format),
        )

    def delete(self, tenant: str, conv_id: str) -> bool:
        existed = self.svc.store.conversations.delete(tenant, conv_id)
        self.svc.tally.delete(tenant, conv_id)
        self.svc.cache.drop(tenant, conv_id)
        return existed

    # --- reads ---------------------------------------------------------------------------
    def info(self, tenant: str, conv_id: str) -> ConversationInfo:
        view = self._view(tenant, conv_id)
        if not view.exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        records = self.svc.store.records.list(tenant, conv_id)
        tail = tail_start(view.window, view.offset, view.head_end, self.svc.settings.keep_recent)
        best = self.svc.store.records.best(tenant, conv_id, upto_max=tail or view.head_end)
        cum = self._tally_at(tenant, conv_id)
        ratio = self.svc.counter.ratio(view.model)
        effective = self._effective(view.total, view.head_end, best, cum)
        extra = self.base.count([], (), view.model)  # priming
        now = time.time()
        return ConversationInfo(
            conversation_id=conv_id,
            length=view.length,
            tokens=scale(ratio, view.total + extra),
            effective_tokens=scale(ratio, effective + extra),
            model=view.model,
            summaries=[
                SummaryInfo(
                    upto=r.upto,
                    prefix_hash=r.prefix_hash,
                    tokens=r.tokens,
                    age_s=round(max(0.0, now - r.created_at), 3),
                    summarizer=r.summarizer,
                )
                for r in records
            ],
        )

    # --- sizes ---------------------------------------------------------------------------
    def _measure(
        self,
        tenant: str,
        conv_id: str,
        window: Window,
        *,
        length: int,
        last_hash: str,
        total: int,
        head: int,
        best: SummaryRecord | None,
        cum: Cum,
        tools: Sequence[ToolSpec],
    ) -> Sizes:
        ratio = self.svc.counter.ratio(window.model)
        extra = self.base.count([], tools, window.model)  # tool specs + priming
        tokens = scale(ratio, total + extra)
        effective = scale(ratio, self._effective(total, head, best, cum) + extra)
        policy = make_policy(self.svc.settings, window, ScaledCounter(self.base, ratio))
        state = policy.state(effective, window.model)
        claim = None
        if state != "under":
            extra = self.base.count_tools(tools, window.model)
            job = window.job(tenant, conv_id, length, last_hash, extra)
            claim = self._claim(job, best, size_step(effective, policy.budget(window.model)))
        return Sizes(length, tokens, effective, state, best, claim)

    def _effective(
        self,
        total: int,
        head: int,
        best: SummaryRecord | None,
        cum: Cum,
    ) -> int:
        """Base tokens of [head][summary][rest], as `ContextPolicy.effective_tokens` counts."""
        if best is None or best.upto <= head:
            return total
        upto_tokens, head_tokens = cum(best.upto, head)
        summary = self.base.count_message(summary_message(best, head))
        return total - upto_tokens + head_tokens + summary

    def _claim(self, job: SummaryJob, best: SummaryRecord | None, step: int) -> Claim | None:
        try:
            return self.svc.trigger.claim(job, "ahead", best, step=step)
        except StoreUnavailable as exc:  # the append is stored; the next trigger asks again
            log.warning(
                "summary.trigger_failed",
                tenant=job.tenant,
                conversation_id=job.conversation_id,
                error=type(exc).__name__,
            )
            return None

    def _tally_at(self, tenant: str, conv_id: str) -> Cum:
        def at(upto: int, head: int) -> tuple[int, int]:
            found = self.svc.tally.at(tenant, conv_id, [upto, head])
            return found[0], found[1]

        return at

    def _recount(self, tenant: str, conv_id: str) -> Cum:
        """Counts from the messages themselves, when the tally was lost to a racing writer."""

        def at(upto: int, head: int) -> tuple[int, int]:
            messages = self.svc.tally.read(tenant, conv_id, start=0, stop=max(upto, head))
            counts = list(accumulate((self.base.count_message(m) for m in messages), initial=0))
            return counts[min(upto, len(messages))], counts[min(head, len(messages))]

        return at
