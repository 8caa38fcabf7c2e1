"""OpenAI's compaction answered from the summary made ahead, and its items expanded after.

`POST /v1/responses/compact` is answered by prefit; prefit's compaction items in later
requests are expanded before the request is fitted.

Codex CLI (`/compact`, and its auto-compaction on the built-in OpenAI provider or one named
`azure`: codex-rs/core/src/compact_remote.rs, `supports_remote_compaction`) and the Agents
SDK's `OpenAIResponsesCompactionSession` (agents/memory/openai_responses_compaction_session.py)
call the endpoint with the transcript (`model`, `instructions`, `input`) and replace their
history with the answer's `output`. OpenAI's answer (openai-python
types/responses/compacted_response.py) is `{"id", "object": "response.compaction",
"created_at", "output", "usage"}`; its `output` holds the user messages and one item
`{"type": "compaction", "id", "encrypted_content"}` (types/responses/
response_compaction_item.py) that the client sends back, as it is, in every later request.

prefit answers it itself, on any upstream, and never forwards it (a provider without the
endpoint, a local vLLM or Ollama, a gateway, answers it with a 404 that Codex cannot get
past): the transcript is read as `POST /v1/responses` reads it (the same conversation id,
the same head) and against the store (`Fitter.open`: the stored conversation's best summary
record, or the tenant's for a prefix of it). Then:

- a record covers it (the workers made it ahead): the answer, in milliseconds, is the head's
  items, one compaction item standing for the messages the record summarizes, and the items
  after them, all as the client sent them (`x-prefit-compaction: summary`). Its
  `encrypted_content` is prefit's sealed reference to the record (`seal`): the record's prefix
  hash, its `upto`, the head's end and the conversation, with an HMAC-SHA256 keyed by the
  server's secret over them and the tenant, so an altered item, or another tenant's, is never
  expanded. The record is also referred to from the tenant's directory under the compaction
  (`compacted-<conversation>`), so it outlives the stored transcript being replaced by the
  compacted one (the directory keeps it for the retention);
- no record covers it: the answer is the transcript as prefit fits it, the cheap strategies
  (truncated and cleared tool outputs, dropped turns with their markers), never a model call
  (`x-prefit-compaction: cheap`), and the summary job is asked for as the stored prepare asks
  for it, so the next compaction finds it. Under the trigger it is fitted as if the window were
  the transcript's own size (`_forced`); `unchanged` when nothing can be shortened.

Codex 0.171 compacts in a turn of its own instead (codex-rs/core/src/compact_remote_v2.rs): a
streamed `POST /v1/responses` whose `input` ends in `{"type": "compaction_trigger"}`, answered
by a response with exactly one output item, the compaction item; it then keeps only its user
messages and that item. The Responses relay hands such a turn here (`triggered`), and the
item carries, sealed with the reference, every other item prefit keeps: those after the
record, or with no record the cheap fit's after the head. The answer is streamed as OpenAI
streams a response (`response.created` ... `response.output_item.done`,
`response.completed`), or its JSON when not streamed.

`usage` is all zeros: no model was called, nothing was billed; what was saved is in
`x-prefit-tokens-before` / `-after`. A compaction that continues server-side state
(`previous_response_id`, `conversation`) holds no transcript prefit could read: it goes to the
provider as it came (`x-prefit-fit: skipped (server-side state: ...)`); the Agents SDK sends
the transcript instead with `compaction_mode="input"` (or `store=False`).

Expansion (`expand`, from the Responses relay, before anything is read or fitted): each item of
`input` whose `type` is `compaction` and whose `encrypted_content` carries prefit's mark is
verified and replaced by the summary message the record stands for (`[Summary of messages a to
b ...]` and its text) and the items it carries, so the provider never sees it. The summary is a
`developer` message: context from the harness, not the person's words, so the head still finds
the task before it (a user message right after the task would make the task read as a preamble,
and the conversation's derived id change at every compaction). Any other compaction item
(OpenAI's own) is carried byte for byte, as every item prefit does not know is. An item with
prefit's mark that does not verify for the caller's tenant is refused (400, naming the item):
it was altered, made for another tenant, or sealed with a secret since rotated. A verified item
whose record is gone (the retention passed, or Redis lost it) loses its summary (the items it
carries still come back) and the rest of the input goes on, the head and the recent items the
client kept (`x-prefit-compaction: expired`): the session continues with its task, without the
summary, rather than failing every later turn. A request carrying a verified item belongs to
the conversation it was made for, unless it names one itself (`X-Prefit-Conversation`): once
compacted, its first follow-up request is in the summary, and the tenant's memory of openings
(shared/store/openings.py) would take the transcript for another conversation opening with the
same task.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders

from api.codec import dumps
from api.deps import Services
from api.proxy.identity import HEADER as CONVERSATION
from api.proxy.owners import check_references
from api.proxy.relay import Fit, Relay
from shared.errors import DoesNotFit, InvalidRequest
from shared.formats.responses import to_responses
from shared.logs import get_logger
from shared.settings import Settings
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.incremental import summary_message

log = get_logger(__name__)

MARK = "prefit.v1."  # how prefit's sealed references begin (OpenAI's are opaque base64)
HEADER = "x-prefit-compaction"
TRIGGER = "compaction_trigger"  # Codex's compaction turn (codex-rs compact_remote_v2.rs)
STATE_FIELDS = ("previous_response_id", "conversation")
_CONTEXT = b"prefit compaction v1"


# --- the sealed reference -------------------------------------------------------------------


@dataclass(frozen=True)
class Sealed:
    """What a compaction item of prefit's stands for: the record of `conversation` for the
    prefix `prefix_hash` (`upto` messages), summarizing the messages after the head's end."""

    conversation: str
    prefix_hash: str  # "" when the item stands for no record (`kept` only)
    upto: int
    head_end: int
    kept: tuple[Any, ...] = ()  # input items it carries after the summary (a triggered one's)


def sealing_key(settings: Settings) -> bytes:
    """The HMAC key: `PREFIT_COMPACTION_SECRET`, else one derived from the deployment's own
    secrets (its tenants' keys, its provider keys), so replicas agree without configuration."""
    if settings.compaction_secret is not None:
        secret = settings.compaction_secret.get_secret_value().encode()
    else:
        parts = [settings.api_keys] + [
            s.get_secret_value() if s is not None else ""
            for s in (settings.openai_api_key, settings.anthropic_api_key)
        ]
        secret = "\0".join(parts).encode()
    return hmac.new(_CONTEXT, secret, hashlib.sha256).digest()


def seal(key: bytes, tenant: str, sealed: Sealed) -> str:
    """The `encrypted_content` of a compaction item standing for `sealed`, for `tenant`."""
    fields = {"c": sealed.conversation, "h": sealed.prefix_hash, "u": sealed.upto}
    payload = orjson.dumps({**fields, "e": sealed.head_end, "k": list(sealed.kept)})
    return f"{MARK}{_b64(payload)}.{_b64(_mac(key, tenant, payload))}"


def unseal(key: bytes, tenant: str, content: str) -> Sealed | None:
    """What `content` (one of prefit's marked references) stands for, if it was sealed for
    `tenant` with `key` and not altered; None otherwise."""
    try:
        encoded, mac = content.removeprefix(MARK).split(".")
        payload = _unb64(encoded)
        if not hmac.compare_digest(_unb64(mac), _mac(key, tenant, payload)):
            return None
        f = orjson.loads(payload)
        kept = tuple(f.get("k") or ())
        return Sealed(str(f["c"]), str(f["h"]), int(f["u"]), int(f["e"]), kept)
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        return None


def _mac(key: bytes, tenant: str, payload: bytes) -> bytes:
    return hmac.new(key, tenant.encode() + b"\0" + payload, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def ours(item: Any) -> bool:
    """Whether an input item is a compaction item prefit made (by its mark; verified apart)."""
    if not isinstance(item, dict) or item.get("type") != "compaction":
        return False
    content = item.get("encrypted_content")
    return isinstance(content, str) and content.startswith(MARK)


def holder(conv_id: str) -> str:
    """The name a compaction refers to its record by in the tenant's directory."""
    return f"compacted-{conv_id}"[:128]


# --- expansion ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expanded:
    """A request body with prefit's compaction items expanded, and what became of them."""

    body: dict[str, Any]
    outcome: str  # "expanded", or "expired" when a record was gone
    conversation: str  # the conversation the (first) item was made for

    def named(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """`headers` naming the item's conversation, unless the client names one: the
        transcript no longer says it (its first follow-up request is in the summary now,
        so the tenant's memory of openings would read the task as a preamble)."""
        if CONVERSATION in headers:
            return headers
        named = MutableHeaders(headers=dict(headers))
        named[CONVERSATION] = self.conversation
        return named


async def expand(svc: Services, tenant: str, body: Mapping[str, Any]) -> Expanded | None:
    """`body` with each of prefit's compaction items in its `input` replaced by the summary
    message of its record (dropped when the record is gone); None when it has none.
    `InvalidRequest` for one that does not verify for `tenant`; `StoreUnavailable` without
    Redis (the item cannot be read without it)."""
    items = body.get("input")
    if not isinstance(items, list) or not any(ours(item) for item in items):
        return None
    key = sealing_key(svc.settings)
    out: list[Any] = []
    expired = False
    conversations: list[str] = []
    for i, item in enumerate(items):
        if not ours(item):
            out.append(item)
            continue
        sealed = unseal(key, tenant, item["encrypted_content"])
        if sealed is None:
            raise InvalidRequest(
                f"input[{i}]: this compaction item was not made by prefit for this API key "
                "(altered, another tenant's, or sealed before the server's secret changed)"
            )
        conversations.append(sealed.conversation)
        if sealed.prefix_hash:
            record = await run_in_threadpool(find_record, svc, tenant, sealed)
            if record is None:
                expired = True
                log.warning(
                    "compaction.expired",
                    tenant=tenant,
                    conversation_id=sealed.conversation,
                    prefix_hash=sealed.prefix_hash,
                )
            else:
                text = summary_message(record, sealed.head_end)["content"]
                out.append({"role": "developer", "content": text})
        out.extend(sealed.kept)
    outcome = "expired" if expired else "expanded"
    return Expanded({**body, "input": out}, outcome, conversations[0])


def find_record(svc: Services, tenant: str, sealed: Sealed) -> SummaryRecord | None:
    """The record `sealed` stands for: the tenant's directory copy (kept for the compaction),
    else the conversation's own; None when both are gone."""
    records = svc.store.records
    found = records.get(tenant, sealed.prefix_hash)
    if found is None:
        found = next(
            (r for r in records.list(tenant, sealed.conversation)
             if r.prefix_hash == sealed.prefix_hash),
            None,
        )  # fmt: skip
    return found if found is not None and found.upto == sealed.upto else None


# --- the compaction endpoint ----------------------------------------------------------------


def server_state(body: Mapping[str, Any]) -> str | None:
    """The field by which `body` continues state held by the provider, if any."""
    return next((f for f in STATE_FIELDS if body.get(f) not in (None, "")), None)


@dataclass(frozen=True)
class Compacted:
    """A compaction's output items, how it was made, and the prompt's size after it."""

    output: list[dict[str, Any]]
    how: str  # summary, cheap, unchanged
    tokens_after: int
    record: SummaryRecord | None = None


def triggered(body: Mapping[str, Any]) -> bool:
    """Whether `body` is Codex's compaction turn: its `input` ends in a `compaction_trigger`."""
    items = body.get("input")
    return bool(items) and isinstance(items, list) and _type(items[-1]) == TRIGGER


def _type(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else None


def _person(item: Any) -> bool:
    """Whether an input item is a user message (what Codex keeps of a compacted history)."""
    return (
        isinstance(item, dict) and item.get("role") == "user" and _type(item) in (None, "message")
    )


@dataclass
class CompactRelay(Relay):
    """One `POST /v1/responses/compact`, answered by prefit (module docstring); or, with
    `trigger`, Codex's compaction turn (a `POST /v1/responses` whose input ends in a
    `compaction_trigger`), answered as a response whose one output is the compaction item."""

    trigger: bool = False

    @classmethod
    def triggered_by(cls, relay: Relay) -> CompactRelay:
        """The compaction a `POST /v1/responses` with a trigger asks for, on its input less
        the trigger."""
        body = {**relay.body, "input": relay.body["input"][:-1]}
        return cls(
            relay.svc, relay.proxy, relay.dialect, relay.asked, relay.caller, body, relay.raw,
            relay.headers, relay.rec, trigger=True,
        )  # fmt: skip

    async def run(self) -> Response:
        # what it continues must be the tenant's own (api/proxy/owners.py)
        await check_references(self.svc, self.proxy, self.dialect, self.caller, self.body)
        if server_state(self.body) is not None:
            if self.trigger:
                raise InvalidRequest(
                    "prefit compacts the input it is sent: a compaction_trigger cannot "
                    "continue server-side state (previous_response_id, conversation)"
                )
            return await super().run()  # `_first_fit` skips it: forwarded as it came
        expanded = await expand(self.svc, self.caller.tenant, self.body)
        if expanded is not None:
            self.body, self.headers = expanded.body, expanded.named(self.headers)
        fit = await self._first_fit()
        if fit is None or self.fitter is None:
            raise InvalidRequest(f"prefit cannot compact this input: {self.label}")
        compacted = await self._compacted(fit)
        self.label = f"compacted ({compacted.how})"
        self.rec.tokens_after = compacted.tokens_after
        self.headers_out[HEADER] = compacted.how
        self._settle()
        if compacted.record is not None:
            self.background.add_task(self._keep, compacted.record)
        report = {**fit.report, "tokens_after": compacted.tokens_after}
        if compacted.record is not None:
            report["summary"] = {"upto": compacted.record.upto}
        headers = self._prefit_headers(replace(fit, report=report))
        if self.trigger:
            return self._turn_answer(compacted.output, headers)
        answer = {
            "id": f"cmp_{secrets.token_hex(12)}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": compacted.output,
            "usage": NO_USAGE,
        }
        return Response(
            dumps(answer),
            status_code=200,
            media_type="application/json",
            headers=headers,
            background=self.background,
        )

    def _turn_answer(self, output: list[dict[str, Any]], headers: dict[str, str]) -> Response:
        """A Responses answer whose output is the compaction item: streamed as OpenAI
        streams one (what Codex's compact_remote_v2.rs reads: one `compaction` item in
        `response.output_item.done`, then `response.completed`), or as its JSON."""
        response = {
            "id": f"resp_{secrets.token_hex(12)}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": self.model,
            "output": output,
            "usage": NO_USAGE,
        }
        if not self.stream:
            return Response(
                dumps(response), media_type="application/json", headers=headers,
                background=self.background,
            )  # fmt: skip
        opened = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opened},
            {"type": "response.in_progress", "response": opened},
        ]
        for k, item in enumerate(output):
            events.append({"type": "response.output_item.added", "output_index": k, "item": item})
            events.append({"type": "response.output_item.done", "output_index": k, "item": item})
        events.append({"type": "response.completed", "response": response})
        body = b"".join(
            b"event: " + e["type"].encode() + b"\ndata: " + dumps({**e, "sequence_number": n})
            + b"\n\n"
            for n, e in enumerate(events)
        )  # fmt: skip
        return Response(
            body, media_type="text/event-stream", headers=headers, background=self.background
        )

    async def _first_fit(self) -> Fit | None:
        state = server_state(self.body)
        if state is not None:
            return self._skip(f"server-side state: {state}")
        return await super()._first_fit()

    async def _compacted(self, fit: Fit) -> Compacted:
        """The output from the record covering the transcript, else the fit itself."""
        fitter = self.fitter
        assert fitter is not None
        if fitter.opened is None and not fitter.degraded:
            await fitter.open()  # under the trigger the fit did not read the store
        opened = fitter.opened
        if opened is not None and opened.best is not None:
            loaded = opened.loaded
            counter = self.svc.scaled_by(
                self.svc.ratios.last_known(self.caller.tenant, fitter.window.model)
            )
            policy = self.svc.policies.get(fitter.window, counter).heading(fitter.preambles)
            regions = loaded.regions(policy)
            built, record = policy.with_best(
                loaded.messages, SummaryBook([opened.best]), loaded.hashes, regions
            )
            if record is not None:
                head = regions[0]
                rest = to_responses(loaded.messages[record.upto :])
                tokens = policy.counter.count(built, fitter.tools, fitter.window.model)
                if self.trigger:  # Codex keeps the user messages: the item carries the rest
                    sealed = Sealed(self._conv(), record.prefix_hash, record.upto, head)
                    item = self._item(replace(sealed, kept=_others(rest)))
                    return Compacted([item], "summary", tokens, record)
                item = self._item(Sealed(self._conv(), record.prefix_hash, record.upto, head))
                output = [*to_responses(loaded.messages[:head]), item, *rest]
                return Compacted(output, "summary", tokens, record)
        fit = await self._forced(fit)
        how = "cheap" if fit.report.get("changed") else "unchanged"
        tokens = round(float(fit.report["tokens_after"]) * float(fit.report["pressure"]))
        if self.trigger:  # one item all the same, carrying what the fit kept but the head
            head = int(fit.report["head"]["end"])
            kept = _others(to_responses(fit.messages[head:]))
            return Compacted([self._item(Sealed(self._conv(), "", 0, head, kept))], how, tokens)
        return Compacted(to_responses(fit.messages), how, tokens)

    async def _forced(self, fit: Fit) -> Fit:
        """`fit`, or when it sends the transcript whole (under the trigger) the fit as if
        the window were the transcript's own size: a client compacts because the history
        is too long for it, and gets it smaller (the cheap strategies to the target of that
        window), not back as it sent it. The pressure puts the transcript midway between
        the trigger and the budget, so the strategies run and the last resort does not."""
        fitter = self.fitter
        if fit.report.get("changed") or fitter is None:
            return fit
        before, budget = int(fit.report["tokens_before"]), int(fit.report["budget"])
        pressure = 2 * before / (budget + int(fit.report["trigger_tokens"]))
        if not 0.0 < pressure < 1.0:
            return fit
        try:
            return await fitter.at(pressure)
        except DoesNotFit:
            return fit

    def _conv(self) -> str:
        assert self.conv_id is not None
        return self.conv_id

    def _item(self, sealed: Sealed) -> dict[str, Any]:
        content = seal(sealing_key(self.svc.settings), self.caller.tenant, sealed)
        return {
            "id": f"cmp_{secrets.token_hex(12)}",
            "type": "compaction",
            "encrypted_content": content,
        }

    def _keep(self, record: SummaryRecord) -> None:
        """Refer the record to the compaction in the tenant's directory (threadpool), so it
        outlives the stored transcript being replaced by the compacted one."""
        assert self.conv_id is not None
        self.svc.store.records.directory.link(  # logs its own failure: the copy is kept
            self.caller.tenant, holder(self.conv_id), record.prefix_hash, record.to_json(),
            overwrite=False,
        )  # fmt: skip


def _others(items: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """`items` but the user messages."""
    return tuple(item for item in items if not _person(item))


NO_USAGE: dict[str, Any] = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}
