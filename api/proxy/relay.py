"""One proxied request, from the client's body to the answer the client gets.

The request is fitted (unless the model has no configured window, or its transcript cannot
be read or cannot fit: then it goes upstream unchanged and `x-prefit-fit` says why), sent
with only its messages replaced, and answered with the provider's own status, headers and
body, plus the `x-prefit-*` headers. A context-length error is retried at a lower pressure
at most `MAX_RETRIES` times, so the client sees only the answer that succeeded; every other
answer (4xx, 5xx, 429 with its `Retry-After`) goes back as it came. After the answer the
store is synced to the transcript and the provider's prompt count is fed to calibration.

The fit (`Fitter`) is the stored prepare of the transcript, at any pressure. Under the
trigger the transcript goes as it is without the store being read. Over it, the transcript
is opened against the store once (`open_conversation`) and fitted by `Preparer.fit`, the
stored prepare itself: the best cached summary record and the cheap strategies, never an LLM
call, never a wait. A retry after an overflow fits the same transcript again at a lower
pressure. Without Redis the request is still fitted, from the cheap strategies and the last
calibration ratio seen (`degraded`). After the answer, `settle` syncs the store to the
transcript and sends the summary jobs scheduled on the way (api/schedule.py).

The transcript against the stored conversation (`open_conversation`, `sync`). Clients resend
the whole transcript each turn, so the stored one is almost always a prefix of it.
`open_conversation` reads the stored transcript (from the API's cache, asking Redis only for
what the cache lacks) and compares it with the request's (C-level list equality): when it is
a prefix, the request's transcript is the stored one plus the new messages, with the stored
prefix hashes extended by those only, and the stored conversation's best summary record
applies to it. Otherwise (a new conversation, an edit, a regeneration) the prefix hashes are
computed afresh and the tenant's longest record for a prefix of it is looked up.

`sync` then makes the store hold exactly the request's transcript: it runs after the answer,
off the request's path, since the fit already works on the transcript as it will be stored.

Token counts (`CountRelay`): Anthropic's `POST /v1/messages/count_tokens` is fitted as
`POST /v1/messages` is, then forwarded: a client that counts before it sends (to decide
whether to compact, or whether the request fits) gets the provider's count of the prompt
prefit would send, not of the transcript it holds; the count also calibrates prefit's
estimates, as a usage does. It is never retried, and it answers with the provider's own
status, body and headers.

The `x-prefit-*` headers of an answer (`prefit_headers`): `x-prefit-fit` says what was done
(`applied`, `unchanged`, `skipped (<reason>)`), then the conversation id, prepare's figures,
the summary used, whether one is due and not ready, the overflow retries, and whether Redis
was unreachable (docs/api.md, "Response headers").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import BackgroundTasks, Response
from fastapi.responses import StreamingResponse

from api.cache import EMPTY_LOADED, Loaded
from api.codec import dumps, loads
from api.conversations import Conversations, Sizes
from api.deadline import upstream_wait
from api.deps import Services
from api.policies import Window, resolve_window
from api.prepare import Preparer
from api.proxy.dialects import Asked, Dialect
from api.proxy.identity import Caller, conversation_ids, resolved
from api.proxy.overflow import (
    FLOOR,
    MAX_RETRIES,
    STEP,
    LoweredReply,
    Overflow,
    next_pressure,
    reply_beside,
    reply_floor,
    requested_output,
    usable,
    with_reply_room,
)
from api.proxy.streaming import OpenedStream, Tap, error_event, passthrough
from api.proxy.upstream import passed_back, upstream_failure, upstream_headers
from api.requestlog import RequestLog
from api.schedule import PendingJob
from shared.errors import (
    ConfigError,
    DoesNotFit,
    InvalidTranscript,
    NotFound,
    PrefitError,
    ReplyDoesNotFit,
    StoreUnavailable,
    UnknownModel,
)
from shared.hashing import canonical, extend_chain, prefix_hashes
from shared.logs import get_logger
from shared.messages import Message, ToolSpec
from shared.reports import new_report
from shared.service.windows import service_policy
from shared.summaries.book import SummaryRecord

if TYPE_CHECKING:  # it holds the dialects, whose relays (responses.py) import this module
    from api.proxy.services import ProxyServices

log = get_logger(__name__)

# --- the transcript against the store -----------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """A request's transcript as the stored prepare sees it once synced."""

    loaded: Loaded
    best: SummaryRecord | None


async def open_conversation(
    svc: Services, tenant: str, conv_id: str, messages: list[Message], window: Window
) -> Opened:
    """`messages` against the stored conversation `conv_id` (`StoreUnavailable` without Redis)."""
    try:
        stored, best = await svc.cache.aload(tenant, conv_id, svc.increments())
    except NotFound:
        stored, best = EMPTY_LOADED, None
    k = stored.length
    if _extends(messages, stored):
        new = messages[k:]
        if not new:
            return Opened(stored, best)
        hashes = extend_chain(stored.hashes[-1], new)
        return Opened(stored.extended(new, [canonical(m) for m in new], hashes), best)
    raw = [canonical(m) for m in messages]
    loaded = Loaded(list(messages), raw, prefix_hashes(messages), sum(map(len, raw)))
    best = await Preparer(svc).record_for(tenant, window, messages, loaded.hashes)
    return Opened(loaded, best)


def _extends(messages: list[Message], stored: Loaded) -> bool:
    """Whether `messages` begin with the (non-empty) stored transcript: C-level equality."""
    k = stored.length
    return bool(k) and k <= len(messages) and messages[:k] == stored.messages


def sync(
    svc: Services,
    tenant: str,
    conv_id: str,
    messages: list[Message],
    *,
    window: Window,
    tools: list[ToolSpec],
    hashes: list[str] | None = None,
) -> Sizes:
    """Make the stored conversation `conv_id` hold exactly `messages` (sync: threadpool):
    `Conversations.sync`, which appends only what is new when the stored transcript is a
    prefix (compared by prefix hash, atomically), and replaces it otherwise. The transcript
    is validated first: a request forwarded unchecked never stores a malformed one. It is
    the one the request validated as frozen (`Relay._checked`), so that is an identity check."""
    validated = svc.validated.validate_with(messages, None, frozen=True)[0]
    return Conversations(svc).sync(tenant, conv_id, validated, window, tools, hashes=hashes)


# --- the fit ------------------------------------------------------------------------------


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


def with_reply(fit: Fit, window: Window, body: Mapping[str, Any], cap: int | None = None) -> Fit:
    """`fit` with the reply `body` may use beside it in `window`, never more than `cap` (the
    reply rule, api/proxy/overflow.py `reply_beside`); `ReplyDoesNotFit` when the fitted
    prompt leaves less than the floor."""
    reply = reply_beside(body, window, int(fit.report["tokens_after"]), cap)
    return fit if reply is None else replace(fit, reply=reply)


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
    pending: list[PendingJob] = field(default_factory=list)  # summary jobs to send after the sync

    async def first(self, pressure: float = 1.0) -> Fit:
        """The first attempt's fit, at `pressure` (below 1 when the conversation's overflows
        showed prefit's estimate of it low: `Corrections`).

        Under the trigger the stored prepare sends the transcript as it is, whatever the
        store holds, so then the store is not read on the request's path at all: the
        transcript is measured as prepare measures it, and synced after the answer.
        """
        try:
            counter = await Preparer(self.svc).counter_for(self.tenant, self.window.model)
        except StoreUnavailable:
            self._degrade()
            return await self._cheap(pressure)
        policy = self.svc.policies.get(self.window, counter).heading(self.preambles)
        limits = policy.limits(self.window.model)
        tokens = policy.tokens(  # named and frozen as the stored prepare's (api/prepare.py)
            self.messages,
            tools=self.tools,
            model=self.window.model,
            conversation=(self.tenant, self.conv_id),
            frozen=True,
        )
        if tokens <= policy.trigger * limits.budget * pressure:
            measured = round(tokens / pressure)  # as prepare measures at a pressure
            head = policy.head(self.messages)
            report = new_report(limits, policy.trigger, measured, pressure, head)
            report["degraded"] = False
            return Fit(self.messages, report, counter.ratio)
        return await self.at(pressure)

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
                if fitted.pending is not None:
                    self.pending.append(fitted.pending)
                return Fit(fitted.prepared.messages, fitted.report, ratio)
        return await self._cheap(pressure)

    async def last_chance(
        self, body: Mapping[str, Any], accept: Callable[[Fit], Fit], pressure: float = 1.0
    ) -> Fit:
        """The last resort, when the head and recent turns exceed the budget: the cheap
        strategies to the whole input window less the reply room `body` asks for (none when
        it asks for none), then to the window less the margin less only the reply floor (the
        reply is then lowered beside the prompt: api/proxy/overflow.py), each keeping the
        recent turns and then only the last one; the first fit `accept` takes (it raises
        `DoesNotFit` for one that leaves the reply less than the floor). A prompt cut that
        deep beats one the provider refuses. `DoesNotFit` when none is accepted."""
        error: DoesNotFit | None = None
        for window, reply in self._resorts(body):
            for keep in self._keeps():
                try:
                    return accept(await self._to_window(keep, window, reply, pressure))
                except DoesNotFit as exc:
                    error = exc
        assert error is not None
        raise error

    def _resorts(self, body: Mapping[str, Any]) -> list[tuple[int, int]]:
        """The windows the last resort fits to, and the reply room each leaves."""
        asked = requested_output(body)
        if asked is None:
            return [(self.window.max_input_tokens, 0)]
        room = min(asked, self.window.reserve_output)
        floor = reply_floor(body)
        out = [(self.window.max_input_tokens, room)]
        return [*out, (usable(self.window), floor)] if floor < room else out

    def _keeps(self) -> tuple[int, ...]:
        """The recent turns kept, then only the last one."""
        return (self.svc.settings.keep_recent, 1)

    async def _to_window(self, keep: int, window: int, reply: int, pressure: float) -> Fit:
        """The cheap strategies' fit to `window` less `reply` at `pressure`, keeping `keep`
        recent turns."""
        counter = self.svc.scaled_by(self.svc.ratios.last_known(self.tenant, self.window.model))
        settings = self.svc.settings.model_copy(update={"keep_recent": keep})
        policy = service_policy(settings, window, reply, counter).heading(self.preambles)
        prepared = await policy.prepare(
            self.messages, tools=self.tools, model=self.window.model, pressure=pressure
        )
        report = dict(prepared.report or {})
        report["degraded"] = self.degraded
        return Fit(prepared.messages, report, counter.ratio)

    def settle(self) -> None:
        """Sync the store to the transcript, then send the scheduled summary jobs (threadpool)."""
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
        if sizes.pending is not None:
            self.pending.append(sizes.pending)
        self.svc.scheduler.send_all(self.pending)

    def _degrade(self) -> None:
        self.opened = None
        self.degraded = True
        self.rec.degraded = True
        log.warning("proxy.degraded", tenant=self.tenant, conversation_id=self.conv_id)

    async def _cheap(self, pressure: float) -> Fit:
        """The fit without Redis: cheap strategies, the last ratio seen for the model."""
        counter = self.svc.scaled_by(self.svc.ratios.last_known(self.tenant, self.window.model))
        window = self.window
        policy = service_policy(
            self.svc.settings, window.max_input_tokens, window.reserve_output, counter
        ).heading(self.preambles)
        prepared = await policy.prepare(
            self.messages, tools=self.tools, model=self.window.model, pressure=pressure
        )
        report = dict(prepared.report or {})
        report["degraded"] = True
        return Fit(prepared.messages, report, counter.ratio)


# --- the relay ----------------------------------------------------------------------------

UNKNOWN = "unknown model"


def _raw(fit: Fit) -> int:
    """The fitted prompt's estimate at pressure 1."""
    return round(float(fit.report["tokens_after"]) * float(fit.report["pressure"]))


def _json(content: bytes) -> Any:
    try:
        return loads(content)
    except ValueError:
        return None


def prefit_headers(
    label: str, retries: int, conv_id: str | None, report: dict[str, Any] | None
) -> dict[str, str]:
    """The `x-prefit-*` headers of an answer; `report` is prepare's (None: not fitted)."""
    out = {"x-prefit-fit": label, "x-prefit-retries": str(retries)}
    if conv_id is not None:
        out["x-prefit-conversation"] = conv_id
    if report is None:
        return out
    out["x-prefit-tokens-before"] = str(report.get("tokens_before"))
    out["x-prefit-tokens-after"] = str(report.get("tokens_after"))
    out["x-prefit-stale"] = "true" if report.get("stale") else "false"
    summary = report.get("summary")
    if isinstance(summary, dict):
        out["x-prefit-summary-upto"] = str(summary.get("upto"))
    if report.get("degraded"):
        out["x-prefit-degraded"] = "true"
    return out


@dataclass
class Relay:
    """Forwards one request; `run` returns the response for the client."""

    svc: Services
    proxy: ProxyServices
    dialect: Dialect
    asked: Asked  # the model, the stream flag and the endpoint, as the dialect read them
    caller: Caller
    body: dict[str, Any]
    raw: bytes  # the body as the client sent it
    headers: Mapping[str, str]
    rec: RequestLog
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    fitter: Fitter | None = None
    conv_id: str | None = None
    # the preambles `_checked` found in this process's memory, and the ids they give
    guessed: tuple[frozenset[str], tuple[str, ...]] | None = None
    label: str = ""  # x-prefit-fit
    tap: Tap | None = None  # a streamed answer's, once it streams
    retries: int = 0
    reply_cap: int | None = None  # the reply the last fit lowered the request's to
    headers_out: dict[str, str] = field(default_factory=dict)  # more x-prefit-* of a dialect's

    def __post_init__(self) -> None:
        self.model = self.asked.model
        self.stream = self.asked.stream
        # a streamed request's body as sent when fitted, and whether to drop what that adds
        self.streamed, self.strip = (
            self.dialect.streamed(self.body) if self.stream else (None, False)
        )

    async def run(self) -> Response:
        fit = await self._first_fit()
        while True:
            body = self._body(fit)
            started = time.perf_counter()
            try:
                async with upstream_wait():  # the provider's time, not prefit's deadline
                    upstream = await self.proxy.clients.send(
                        self.dialect.upstream,
                        self._upstream_headers(),
                        body,
                        self.asked.endpoint,
                        tenant=self.caller.tenant,
                    )
            except httpx.TransportError as exc:
                return self._unreachable(exc, fit)
            finally:
                waited = (time.perf_counter() - started) * 1000
                self.rec.upstream_ms = round((self.rec.upstream_ms or 0.0) + waited, 3)
            self.rec.upstream_status = upstream.status_code
            if self.stream and upstream.status_code < 300:
                opened = OpenedStream(upstream)
                async with upstream_wait():
                    overflow = await self._stream_overflow(opened)
                retried = await self._after(fit, overflow)
                if retried is None:
                    return self._streamed(upstream, fit, opened)
                await upstream.aclose()
                fit = retried
                continue
            try:
                async with upstream_wait():
                    content = await upstream.aread()
            except httpx.TransportError as exc:  # it broke off (or paused too long) mid-answer
                return self._unreachable(exc, fit)
            finally:
                await upstream.aclose()
            if self._refused_usage(upstream.status_code, content):
                continue
            answer = _json(content)
            retried = await self._after(fit, self.dialect.overflow(upstream.status_code, answer))
            if retried is not None:
                fit = retried
                continue
            return self._answered(upstream, content, answer, fit)

    async def _stream_overflow(self, opened: OpenedStream) -> Overflow | None:
        """A context-length error the provider reports inside a stream it opened, read
        ahead before any event is passed on; None (nothing read) where none comes so."""
        return None

    async def _after(self, fit: Fit | None, overflow: Overflow | None) -> Fit | None:
        """The fit to retry with after `overflow`; None when there is none (or no retry)."""
        if overflow is None:
            return None
        return await (self._retry(fit, overflow) if fit is not None else self._learn(overflow))

    def _refused_usage(self, status: int, content: bytes) -> bool:
        """Whether the upstream refused the `stream_options` prefit added (older Azure
        API versions, some compatible servers): then it is sent again as the client sent
        it, and the stream's prompt count goes unobserved."""
        if self.streamed is None or status != 400 or b"stream_options" not in content:
            return False
        self.streamed, self.strip = None, False
        log.info("proxy.usage_refused", upstream=self.dialect.name)
        return True

    # --- the fit -------------------------------------------------------------------------
    async def _first_fit(self) -> Fit | None:
        """The fit at pressure 1, or None (with `label` saying why) to forward unchanged."""
        try:
            window = resolve_window(self.svc.settings, self.model, None)
        except UnknownModel:
            learned = self.proxy.learned.get(self.caller.tenant, self.model)
            if learned is None:
                return self._skip(UNKNOWN)
            return await self._fit_in(with_reply_room(learned, self.body))
        except ConfigError:  # a configured window not larger than its reserve
            return self._skip("no usable window")
        return await self._fit_in(with_reply_room(window, self.body))

    async def _fit_in(self, window: Window) -> Fit | None:
        """The fit at pressure 1 to `window`, or None (with `label` saying why)."""
        try:
            return await self._fit_to(window)
        except RecursionError:  # JSON nested past what copying and hashing recurse through
            self.fitter = None
            return self._skip("nested too deeply")

    async def _fit_to(self, window: Window) -> Fit | None:
        try:
            messages, tools = self.dialect.transcript(self.body, self._checked)
        except InvalidTranscript as exc:
            where = f" at message {exc.index}" if exc.index is not None else ""
            return self._skip(f"invalid transcript{where}")
        self.conv_id, preambles = await resolved(
            self.svc.increments().client,
            self.svc.openings,
            self.headers,
            self.body,
            self.caller.tenant,
            messages,
            self.guessed,
        )
        self.rec.conversation_id = self.conv_id
        self.rec.length = len(messages)
        if len(messages) > self.svc.settings.max_messages:
            return self._skip("too many messages")
        self.fitter = Fitter(
            self.svc,
            self.caller.tenant,
            self.conv_id,
            messages,
            tools,
            window,
            self.rec,
            preambles=preambles,
        )
        try:
            learned = self.proxy.corrections.pressure(self.caller.tenant, self.conv_id)
            return self._fitted(await self.fitter.first(learned))
        except DoesNotFit:
            pass
        try:  # the head and recent turns exceed the budget: never forward it over the window
            return await self.fitter.last_chance(self.body, self._fitted)
        except DoesNotFit as exc:  # refused, never forwarded to fail (the reply rule)
            raise self._refusal(exc) from None

    def _checked(self, messages: Any) -> list[Message]:
        """The request's messages (OpenAI format) named and validated. The stored
        conversation's own objects first replace the equal messages they start with (one
        comparison by content, `ConversationCache.shared`): those are never changed, nor
        are the request's own after parsing, so the transcript is validated as frozen and
        every later step (counting, the stored prepare, the sync) meets objects it has seen
        and compares by identity, paying only for the new messages."""
        try:
            tenant = self.caller.tenant  # the memory as this process knows it: `_fit_to` reads it
            preambles = self.svc.openings.cached(tenant, messages)
            ids = conversation_ids(self.headers, self.body, tenant, messages, preambles)
            self.guessed, self.conv_id = (preambles, ids), ids[0]
        except (AttributeError, TypeError, KeyError):  # not messages: validation says why
            self.svc.validated.validate(messages)
            raise
        messages = self.svc.cache.shared(self.caller.tenant, self.conv_id, messages)
        return self.svc.validated.validate_with(messages, None, frozen=True)[0]

    def _skip(self, reason: str) -> Fit | None:
        self.label = f"skipped ({reason})"
        log.info("proxy.fit_skipped", reason=reason, tenant=self.caller.tenant)
        return None

    def _fitted(self, fit: Fit) -> Fit:
        """`fit` with its reply (`with_reply`, never more than the last attempt sent), noted
        as the one to send; `DoesNotFit` when it leaves the reply less than the floor."""
        assert self.fitter is not None
        fit = with_reply(fit, self.fitter.window, self.body, self.reply_cap)
        if fit.reply is not None:
            self.reply_cap = fit.reply.sent
        self.label = "applied" if fit.report.get("changed") else "unchanged"
        self.rec.tokens_before = fit.report.get("tokens_before")
        self.rec.tokens_after = fit.report.get("tokens_after")
        return fit

    async def _retry(self, fit: Fit, overflow: Overflow) -> Fit | None:
        """The fit for the retry after an overflow, or None when no retry is left or fits."""
        if self.fitter is None or self.retries >= MAX_RETRIES:
            return None
        report = fit.report
        if overflow.prompt_tokens:  # the error's own count of what was sent: calibrate on it
            self._observe(fit, overflow.prompt_tokens)
            self.proxy.corrections.overflowed(
                self.caller.tenant, self.conv_id or "", overflow.prompt_tokens, _raw(fit)
            )
        pressure = next_pressure(
            float(report["pressure"]),
            overflow,
            estimated=_raw(fit),
            budget=int(report["budget"]),
            reserve=self.fitter.window.reserve_output,
        )
        self.retries += 1
        self.rec.retries = self.retries
        log.info(
            "proxy.overflow_retried",
            tenant=self.caller.tenant,
            conversation_id=self.conv_id,
            retry=self.retries,
            pressure=round(pressure, 4),
            provider_tokens=overflow.prompt_tokens,
            provider_limit=overflow.limit,
        )
        try:
            return self._fitted(await self._smaller(fit, pressure))
        except DoesNotFit:
            pass
        try:  # every step the first attempt had: the last resort too, at this pressure
            return await self.fitter.last_chance(self.body, self._fitted, pressure)
        except DoesNotFit:
            return None  # the provider's own error goes back

    def _refusal(self, exc: DoesNotFit) -> ReplyDoesNotFit:
        """The error refusing a request no fit leaves its least reply for."""
        if isinstance(exc, ReplyDoesNotFit):
            return exc
        assert self.fitter is not None
        window = self.fitter.window
        return ReplyDoesNotFit(
            tokens=exc.tokens,
            window=window.max_input_tokens,
            floor=reply_floor(self.body),
            asked=requested_output(self.body) or 0,
            model=window.model,
        )

    async def _learn(self, overflow: Overflow) -> Fit | None:
        """After an overflow of a request sent unfitted for want of a window: the fit to the
        window the error states (`LearnedWindows`); None when there is none."""
        if self.label != f"skipped ({UNKNOWN})" or self.retries >= MAX_RETRIES:
            return None
        window = self.proxy.learned.learn(
            self.caller.tenant, self.model, overflow, self.svc.settings.reserve_output
        )
        if window is None:
            return None
        self.retries += 1
        self.rec.retries = self.retries
        log.info("proxy.window_learned", model=self.model, window=window.max_input_tokens)
        return await self._fit_in(window)

    async def _smaller(self, last: Fit, pressure: float) -> Fit:
        """The fit at `pressure`, or lower until it is smaller than `last` (the target's
        slack can make a lower pressure cut nothing more; resending it would be futile)."""
        assert self.fitter is not None
        sent = _raw(last)
        while True:
            fit = await self.fitter.at(pressure)
            if _raw(fit) < sent or pressure <= FLOOR:
                return fit
            pressure = max(FLOOR, pressure * STEP)

    # --- the upstream request ------------------------------------------------------------
    def _body(self, fit: Fit | None) -> bytes:
        """What goes upstream: the client's bytes unless the messages or stream options change."""
        if fit is None:
            return self.raw  # skipped: forwarded exactly as it came
        if not fit.report.get("changed") and fit.reply is None:
            return self.raw if self.streamed is None else dumps(self.streamed)
        base = self.streamed if self.streamed is not None else self.body
        if fit.reply is not None:
            base = fit.reply.apply(base)
        return dumps(self.dialect.with_messages(base, fit.messages))

    def _upstream_headers(self) -> dict[str, str]:
        key = self.dialect.upstream.key
        return upstream_headers(self.dialect, self.caller, key, self.headers)

    # --- the answer ----------------------------------------------------------------------
    def _answered(
        self, upstream: httpx.Response, content: bytes, answer: Any, fit: Fit | None
    ) -> Response:
        if fit is not None and upstream.status_code < 300:
            tokens = self.dialect.prompt_tokens(answer)
            if tokens:
                self._counted(fit, tokens)
        self._settle()
        return Response(
            content,
            status_code=upstream.status_code,
            headers=self._answer_headers(upstream.headers, fit),
            background=self.background,
        )

    def _streamed(
        self, upstream: httpx.Response, fit: Fit | None, opened: OpenedStream
    ) -> Response:
        tap = self.tap = self.dialect.tap(self.strip and fit is not None)  # unfitted: as it came
        if fit is not None:
            self.background.add_task(self._observe_stream, fit, tap)
        self._settle()
        return StreamingResponse(
            passthrough(upstream, tap, self.rec, self._broken(), opened),
            status_code=upstream.status_code,
            headers=self._answer_headers(upstream.headers, fit),
            background=self.background,
        )

    def _broken(self) -> bytes:
        message = f"{self.dialect.name} upstream broke off the stream"
        return error_event(self.dialect.error(502, message))

    def _unreachable(self, exc: httpx.TransportError, fit: Fit | None) -> Response:
        status, message = upstream_failure(exc, self.dialect.name, self.rec)
        self._settle()
        return Response(
            dumps(self.dialect.error(status, message)),
            status_code=status,
            headers={**self._prefit_headers(fit), "content-type": "application/json"},
            background=self.background,
        )

    def _answer_headers(self, upstream: httpx.Headers, fit: Fit | None) -> dict[str, str]:
        return {**passed_back(upstream), **self._prefit_headers(fit)}

    def _prefit_headers(self, fit: Fit | None) -> dict[str, str]:
        self.rec.fit = self.label
        report = fit.report if fit is not None else None
        out = prefit_headers(self.label, self.retries, self.conv_id, report) | self.headers_out
        if fit is not None and fit.reply is not None:
            out.update(fit.reply.headers())
        return out

    # --- after the answer ----------------------------------------------------------------
    def _settle(self) -> None:
        if self.fitter is not None:
            self.background.add_task(self.fitter.settle)  # sync: Starlette runs it in a thread

    def _observe(self, fit: Fit, tokens: int) -> None:
        self.background.add_task(self._calibrate, fit, tokens)

    def _counted(self, fit: Fit, tokens: int) -> None:
        """An answer's prompt count: calibration, and the conversation's correction."""
        self.proxy.corrections.counted(self.caller.tenant, self.conv_id or "", tokens, _raw(fit))
        self._observe(fit, tokens)

    async def _observe_stream(self, fit: Fit, tap: Tap) -> None:
        if tap.prompt_tokens:
            self.proxy.corrections.counted(
                self.caller.tenant, self.conv_id or "", tap.prompt_tokens, _raw(fit)
            )
            await self._calibrate(fit, tap.prompt_tokens)

    async def _calibrate(self, fit: Fit, tokens: int) -> None:
        if self.fitter is None:
            return
        try:
            await Preparer(self.svc).calibrate(
                self.caller.tenant,
                self.model,
                fit.messages,
                self.fitter.tools,
                tokens,
                estimated=fit.estimated,
            )
        except PrefitError as exc:  # the answer is out; a lost observation only slows learning
            log.warning("proxy.observe_failed", tenant=self.caller.tenant, error=type(exc).__name__)


class CountRelay(Relay):
    """One count-tokens request (`POST /v1/messages/count_tokens`, ...): fitted, forwarded
    once, its count (`Dialect.counted`) observed."""

    async def run(self) -> Response:
        fit = await self._first_fit()
        try:
            async with upstream_wait():
                upstream = await self.proxy.clients.request(
                    self.dialect.upstream,
                    "POST",
                    self.asked.endpoint,
                    self._upstream_headers(),
                    self._body(fit),
                    tenant=self.caller.tenant,
                )
        except httpx.TransportError as exc:
            return self._unreachable(exc, fit)
        self.rec.upstream_status = upstream.status_code
        if fit is not None and upstream.status_code < 300:
            tokens = self.dialect.counted(_json(upstream.content))
            if tokens:
                self._observe(fit, tokens)
        self._settle()
        return Response(
            upstream.content,
            status_code=upstream.status_code,
            headers=self._answer_headers(upstream.headers, fit),
            background=self.background,
        )
