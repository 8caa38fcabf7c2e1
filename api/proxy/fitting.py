"""One proxied request's fit: the stored prepare of its transcript, at any pressure.

Under the trigger the transcript goes as it is without the store being read. Over it, the
transcript is opened against the store once (api/proxy/transcripts.py) and fitted by
`Preparer.fit`, the stored prepare itself: the best cached summary record and the cheap
strategies, never an LLM call, never a wait. A retry after an overflow fits the same
transcript again at a lower pressure. Without Redis the request is still fitted, from the
cheap strategies and the last calibration ratio seen (`degraded`). After the answer,
`settle` syncs the store to the transcript and sends the summary jobs claimed on the way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from api.deps import Services
from api.enqueue import Claim
from api.logging import RequestLog
from api.policies import Window, make_policy
from api.prepare import Preparer
from api.proxy.overflow import LoweredReply, lowered_reply, requested_output, usable
from api.proxy.transcripts import Opened, open_conversation, sync
from shared.errors import DoesNotFit, PrefitError, StoreUnavailable
from shared.logs import get_logger
from shared.messages import Message, ToolSpec
from shared.reports import new_report
from shared.service.windows import service_policy

log = get_logger(__name__)


@dataclass(frozen=True)
class Fit:
    """The messages to send, prepare's report on them, the calibration ratio it used, and
    the reply the request may use when it had to be lowered for them."""

    messages: list[Message]
    report: dict[str, Any]
    ratio: float = 1.0
    reply: LoweredReply | None = None  # the reply it leaves room for, when lowered

    @property
    def estimated(self) -> int:
        """The uncalibrated estimate of the prompt (what calibration compares with the
        provider's count), from the report: within a token or two of counting it again."""
        after, pressure = float(self.report["tokens_after"]), float(self.report["pressure"])
        return round(after * pressure / self.ratio)


def with_reply(fit: Fit, window: Window, body: Mapping[str, Any]) -> Fit:
    """`fit` with the reply `body` asks for lowered to what the fitted prompt leaves of
    `window` when prompt + reply would exceed it (the provider would refuse it), if the
    rule allows (api/proxy/overflow.py, `lowered_reply`); as it is otherwise."""
    asked = requested_output(body)
    prompt = int(fit.report["tokens_after"])
    if asked is None or prompt + asked <= window.max_input_tokens:
        return fit
    lowered = lowered_reply(body, usable(window) - prompt)
    return fit if lowered is None else replace(fit, reply=lowered)


@dataclass
class Fitter:
    """Fits one request's transcript (`first`, then `at` a lower pressure after an overflow),
    and syncs the store to it after the answer (`settle`)."""

    svc: Services
    tenant: str
    conv_id: str
    messages: list[Message]
    tools: list[ToolSpec]
    window: Window
    rec: RequestLog
    opened: Opened | None = None  # what the store holds, once read
    degraded: bool = False  # Redis was unreachable: cheap strategies only
    preambles: frozenset[str] = frozenset()  # the tenant's learned ones (store/openings.py)
    claims: list[Claim] = field(default_factory=list)  # summary jobs to send after the sync

    async def first(self) -> Fit:
        """The fit at pressure 1.

        Under the trigger the stored prepare sends the transcript as it is, whatever the
        store holds, so then the store is not read on the request's path at all: the
        transcript is measured as prepare measures it, and synced after the answer.
        """
        try:
            counter = await Preparer(self.svc).counter_for(self.tenant, self.window.model)
        except StoreUnavailable:
            self._degrade()
            return await self._cheap(1.0)
        policy = self.svc.policies.get(self.window, counter).heading(self.preambles)
        limits = policy.limits(self.window.model)
        tokens = policy.tokens(  # named and frozen as the stored prepare's (api/prepare.py)
            self.messages,
            tools=self.tools,
            model=self.window.model,
            conversation=(self.tenant, self.conv_id),
            frozen=True,
        )
        if tokens <= policy.trigger * limits.budget:
            report = new_report(limits, policy.trigger, tokens, 1.0, policy.head(self.messages))
            report["degraded"] = False
            return Fit(self.messages, report, counter.ratio)
        return await self.at(1.0)

    async def open(self) -> None:
        """Read what the store holds of the conversation (nothing, without Redis)."""
        try:
            self.opened = await open_conversation(
                self.svc, self.tenant, self.conv_id, self.messages, self.window
            )
        except StoreUnavailable:
            self._degrade()

    async def at(self, pressure: float) -> Fit:
        """The fit at `pressure` (`DoesNotFit` when even the head and recent turns exceed)."""
        if self.opened is None and not self.degraded:
            await self.open()
        if self.opened is not None:
            try:
                ratio = (await Preparer(self.svc).counter_for(self.tenant, self.window.model)).ratio
                fitted = await Preparer(self.svc).fit(
                    self.tenant,
                    self.conv_id,
                    self.opened.loaded,
                    self.opened.best,
                    self.tools,
                    self.window,
                    pressure=pressure,
                    wait_ms=0,
                    rec=self.rec,
                    preambles=self.preambles,
                )
            except StoreUnavailable:
                self._degrade()
            else:
                if fitted.claim is not None:
                    self.claims.append(fitted.claim)
                return Fit(fitted.prepared.messages, fitted.report, ratio)
        return await self._cheap(pressure)

    async def last_chance(self, body: Mapping[str, Any]) -> Fit:
        """The fit when the head and recent turns exceed the budget: the cheap strategies to
        the whole input window less only the reply `body` asks for (providers refuse
        prompt + max_tokens over the window; none when it asks for none), keeping only the
        last turn if need be, rather than forwarding a prompt over the window. When even
        that leaves less room than the reply asked for, the same with the reply lowered to
        what the window leaves (api/proxy/overflow.py, `lowered_reply`; the fit's `reply` says so).
        `DoesNotFit` when even that fails."""
        asked = requested_output(body)
        whole = self.window.max_input_tokens
        reply = min(asked, whole - 1) if asked is not None else 0
        error: DoesNotFit | None = None
        deepest: dict[int, int] = {}  # keep -> the least prompt the strategies reach
        for keep in self._keeps():
            try:
                return await self._to_window(keep, whole, reply)
            except DoesNotFit as exc:
                error, deepest[keep] = exc, exc.tokens
        for keep in self._keeps():
            lowered = lowered_reply(body, usable(self.window) - deepest[keep])
            if lowered is None:
                continue
            try:  # the reply is lowered to what this fit leaves (`with_reply`)
                return await self._to_window(keep, usable(self.window), lowered.sent)
            except DoesNotFit:
                continue
        assert error is not None
        raise error

    def _keeps(self) -> tuple[int, ...]:
        """The recent turns kept, then only the last one."""
        return (self.svc.settings.keep_recent, 1)

    async def _to_window(self, keep: int, window: int, reply: int) -> Fit:
        """The cheap strategies' fit to `window` less `reply`, keeping `keep` recent turns."""
        counter = self.svc.scaled_by(self.svc.ratios.last_known(self.tenant, self.window.model))
        settings = self.svc.settings.model_copy(update={"keep_recent": keep})
        policy = service_policy(settings, window, reply, counter).heading(self.preambles)
        prepared = await policy.prepare(self.messages, tools=self.tools, model=self.window.model)
        report = dict(prepared.report or {})
        report["degraded"] = self.degraded
        return Fit(prepared.messages, report, counter.ratio)

    def settle(self) -> None:
        """Sync the store to the transcript, then send the claimed summary jobs (threadpool)."""
        hashes = self.opened.loaded.hashes if self.opened is not None else None
        try:
            sizes = sync(
                self.svc,
                self.tenant,
                self.conv_id,
                self.messages,
                window=self.window,
                tools=self.tools,
                hashes=hashes,
            )
        except (PrefitError, RecursionError) as exc:  # the answer stands; the next request
            # syncs again (RecursionError: nested deeper than hashing recurses on this thread)
            log.warning(
                "proxy.sync_failed",
                tenant=self.tenant,
                conversation_id=self.conv_id,
                error=type(exc).__name__,
            )
            return
        if sizes.claim is not None:
            self.claims.append(sizes.claim)
        for claim in self.claims:
            self.svc.trigger.send(claim)

    def _degrade(self) -> None:
        self.opened = None
        self.degraded = True
        self.rec.degraded = True
        log.warning("proxy.degraded", tenant=self.tenant, conversation_id=self.conv_id)

    async def _cheap(self, pressure: float) -> Fit:
        """The fit without Redis: cheap strategies, the last ratio seen for the model."""
        counter = self.svc.scaled_by(self.svc.ratios.last_known(self.tenant, self.window.model))
        policy = make_policy(self.svc.settings, self.window, counter).heading(self.preambles)
        prepared = await policy.prepare(
            self.messages, tools=self.tools, model=self.window.model, pressure=pressure
        )
        report = dict(prepared.report or {})
        report["degraded"] = True
        return Fit(prepared.messages, report, counter.ratio)
