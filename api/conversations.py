"""Stored conversations: append, sync (PUT), describe, delete (sync: run in the threadpool).

Every check runs before the one write: limits, the window, the tool specs, the tenant's
calibration ratio, the messages validated against the stored tip. The write itself is one
Lua call (shared/store/writes.py) that extends the messages, their prefix chain, the running
token tally and the metadata together, so a request that is refused has changed nothing.

An append costs O(new messages + recent turn groups), never O(conversation): it validates
the new messages against the last stored group, counts only them, and the same call measures
the effective tokens (head + best summary + rest) from the tally. Appends without
`expected_length` never lose a race: messages valid after any tip land wherever the tip is;
messages that depend on the tip (tool results, or a tip with unanswered tool calls) are
written only if the tip is still the one they were validated against, and otherwise
validated again against the new tip (which then accepts them, or refuses them precisely).
When the effective tokens near the trigger the workers are asked for the next summary, once
per state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import accumulate

from api.deps import Services
from api.payloads import incoming, incoming_tools, validate_appended
from api.policies import Window
from api.schemas import AppendRequest, ConversationInfo, ReplaceRequest, SummaryInfo
from api.sizes import Sizes, Sizing
from api.views import View, context_start, is_bound, kept_head_end, known_tail_start
from shared.counting.calibration import scale
from shared.errors import InvalidTranscript, LengthMismatch, NotFound, WriteConflict
from shared.hashing import prefix_hashes
from shared.head import head_end
from shared.logs import get_logger
from shared.messages import Message, ToolSpec, validate
from shared.store.writes import Append, Replacement

log = get_logger(__name__)

# Validations of one write against a tip that kept moving under it. Each refusal means
# another writer's append landed, so this bounds a pathological stream, not normal traffic.
MAX_REVALIDATIONS = 64

__all__ = ["Conversations", "Sizes"]


class Conversations:
    """The conversation routes' logic, on the app's services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.base = svc.base
        self.writes = svc.store.conversations.writes
        self.sizing = Sizing(svc)

    # --- writes --------------------------------------------------------------------------
    def append(self, tenant: str, conv_id: str, req: AppendRequest, window: Window) -> Sizes:
        """Append the request's messages (see the module); `LengthMismatch` if
        `expected_length` differs, `InvalidTranscript` if they do not continue the tip."""
        tools = incoming_tools(req.tools, format=req.format)
        scaled = self.svc.scaled(tenant, window.model)
        for _ in range(MAX_REVALIDATIONS):
            view = self.sizing.view(tenant, conv_id)
            new = self._checked(view, req)
            head = head_end([*view.window, *new]) if view.offset == 0 else view.head_end
            done = self.writes.append(tenant, conv_id, self._plan(view, new, head, req, window))
            if done.refused is None:
                break
            log.info(
                "conversation.append_revalidated",
                tenant=tenant,
                conversation_id=conv_id,
                reason=done.refused,
            )
        else:
            raise WriteConflict(_conflict(conv_id))
        self.svc.cache.appended(
            tenant, conv_id, old_length=done.old_length, old_hash=done.old_hash, messages=new
        )
        return self.sizing.after(tenant, conv_id, window, scaled, tools, done, head)

    def replace(self, tenant: str, conv_id: str, req: ReplaceRequest, window: Window) -> Sizes:
        """PUT: the request's transcript becomes the conversation (see `sync`)."""
        messages = validate(incoming(req.messages, format=req.format, system=req.system))
        tools = incoming_tools(req.tools, format=req.format)
        return self.sync(
            tenant, conv_id, messages, window, tools, expected_length=req.expected_length
        )

    def sync(
        self,
        tenant: str,
        conv_id: str,
        messages: list[Message],
        window: Window,
        tools: Sequence[ToolSpec] = (),
        *,
        expected_length: int | None = None,
        hashes: Sequence[str] | None = None,
    ) -> Sizes:
        """Make the stored conversation equal `messages` (validated, OpenAI format).

        When the stored transcript is a prefix of `messages` (its tip hash equals their
        prefix hash at its length) only the messages after it are written, by the same
        atomic append (O(new) in Redis and in counting); otherwise the whole transcript
        replaces it. For clients that resend the whole transcript every turn. `hashes`:
        the prefix hashes of `messages` when the caller has them.
        """
        scaled = self.svc.scaled(tenant, window.model)
        hashes = list(hashes) if hashes is not None else prefix_hashes(messages)
        head = head_end(messages)
        tail = known_tail_start(messages, 0, head, self.svc.settings.keep_recent) or head
        bound, counter = is_bound(messages, 0), self.svc.counter_id
        for _ in range(MAX_REVALIDATIONS):
            tip = self.svc.tally.tip(tenant, conv_id, counter=self.svc.counter_id, tail=1)
            if expected_length is not None and tip.length != expected_length:
                raise LengthMismatch(expected_length, tip.length)
            k = tip.length
            if not (tip.exists and k <= len(messages) and hashes[k] == tip.last_hash):
                counts = accumulate(self.base.count_message(m) for m in messages)
                whole = Replacement(
                    messages,
                    hashes,
                    list(counts),
                    counter=counter,
                    expected_length=expected_length,
                    bound=bound,
                    head_end=kept_head_end(messages, len(messages)),
                    upto_max=tail,
                    model=window.model,
                )
                done = self.writes.replace(tenant, conv_id, whole)
                self.svc.cache.drop(tenant, conv_id)
                return self.sizing.after(tenant, conv_id, window, scaled, tools, done, head)
            new = messages[k:]
            counts_new = [self.base.count_message(m) for m in new]
            grow = Append(
                new,
                counts_new,
                counter=counter,
                after=tip.last_hash,
                expected_length=k,
                bound=bound,
                head_end=kept_head_end(messages, len(messages)),
                viewed=k,
                upto_max=tail,
                model=window.model,
            )
            try:
                done = self.writes.append(tenant, conv_id, grow)
            except LengthMismatch:
                continue  # another writer got in first: look again
            if done.refused is None:
                self.svc.cache.appended(
                    tenant, conv_id, old_length=k, old_hash=tip.last_hash, messages=new
                )
                return self.sizing.after(tenant, conv_id, window, scaled, tools, done, head)
        raise WriteConflict(_conflict(conv_id))

    def delete(self, tenant: str, conv_id: str) -> bool:
        existed = self.svc.store.conversations.delete(tenant, conv_id)
        self.svc.cache.drop(tenant, conv_id)
        return existed

    def _checked(self, view: View, req: AppendRequest) -> list[Message]:
        """The request's messages in OpenAI form, checked against the stored tip."""
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
        return new

    def _plan(
        self, view: View, new: list[Message], head: int, req: AppendRequest, window: Window
    ) -> Append:
        """Where `new` may land: anywhere on an unbound tip, unless it answers the tip's
        tool calls; else only on the tip it was validated against."""
        full = [*view.window, *new]
        anchored = not view.exists or view.bound or bool(new and new[0].get("role") == "tool")
        return Append(
            new,
            [self.base.count_message(m) for m in new],
            counter=self.svc.counter_id,
            after=view.last_hash if anchored else None,
            free=not anchored,
            expected_length=req.expected_length,
            bound=is_bound(full, view.offset),
            # the first user message may still be to come: store a head end that makes the
            # next reader recount the head (`views.kept_head_end`)
            head_end=(kept_head_end(full, view.length + len(new)) if view.offset == 0 else head)
            if anchored
            else None,
            viewed=view.length,
            upto_max=known_tail_start(full, view.offset, head, self.svc.settings.keep_recent)
            or head,
            model=window.model,
        )

    # --- reads ---------------------------------------------------------------------------
    def info(self, tenant: str, conv_id: str) -> ConversationInfo:
        view = self.sizing.view(tenant, conv_id)
        if not view.exists:
            raise NotFound(f"conversation {conv_id!r} not found")
        records = self.svc.store.records.list(tenant, conv_id)
        m = self.sizing.measured(tenant, conv_id, view)
        ratio = self.svc.scaled(tenant, view.model).ratio
        effective = self.sizing.effective(m)
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


def _conflict(conv_id: str) -> str:
    return (
        f"conversation {conv_id!r} kept changing while this write was validated "
        f"({MAX_REVALIDATIONS} times); nothing was written"
    )
