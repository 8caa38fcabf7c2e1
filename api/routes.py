"""The HTTP routes (see docs/api.md): thin; the logic is in conversations.py and prepare.py.

Handlers are async and hand blocking Redis work to the threadpool in one hop each (the stored
prepare reads on an asyncio client instead), so a slow or absent Redis never stalls the
event loop (health checks keep answering).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, Path, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from api.auth import metrics_access
from api.codec import StrictRoute
from api.conversations import Conversations, Sizes
from api.deadline import within
from api.deps import Services, get_services, get_tenant
from api.errors import RETRY_AFTER_S
from api.limits import check_sizes
from api.policies import Window, resolve_window
from api.prepare import Preparer
from api.requestlog import RequestLog, request_log
from api.schemas import (
    CONVERSATION_ID,
    AppendRequest,
    ConversationInfo,
    ConversationState,
    ErrorResponse,
    ObserveRequest,
    PrepareRequest,
    PrepareResponse,
    PrepareStoredRequest,
    ReplaceRequest,
)
from shared.store import keys
from shared.store.breaker import overall

ConvId = Annotated[str, Path(pattern=CONVERSATION_ID, max_length=keys.MAX_ID_CHARS)]
Tenant = Annotated[str, Depends(get_tenant)]
Svc = Annotated[Services, Depends(get_services)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 409, 413, 422, 503)
}
_CONV_ERRORS: dict[int | str, dict[str, Any]] = {**_ERRORS, 404: {"model": ErrorResponse}}
JSON = "application/json"

router = APIRouter(route_class=StrictRoute)  # bodies read as strict JSON (api/codec.py)


def _limit(svc: Services, **fields: Any) -> None:
    s = svc.settings
    check_sizes(fields.items(), max_messages=s.max_messages, max_string_chars=s.max_string_chars)


def _after(rec: RequestLog, sizes: Sizes, background: BackgroundTasks, svc: Services) -> None:
    rec.length = sizes.length
    if sizes.pending is not None:
        rec.enqueued = sizes.pending.kind
        background.add_task(svc.scheduler.send, sizes.pending)  # after the answer is sent


def _state(conv_id: str, sizes: Sizes) -> ConversationState:
    return ConversationState(
        conversation_id=conv_id,
        length=sizes.length,
        tokens=sizes.tokens,
        effective_tokens=sizes.effective_tokens,
        state=sizes.state,
    )


@router.post("/v1/conversations/{conversation_id}/messages", responses=_ERRORS)
async def append_messages(
    request: Request,
    conversation_id: ConvId,
    body: AppendRequest,
    tenant: Tenant,
    svc: Svc,
    background: BackgroundTasks,
) -> ConversationState:
    """Append turn(s); 409 unless `expected_length` (if given) is the stored length."""
    write = Conversations(svc).append
    return await _write(request, conversation_id, body, tenant, svc, background, write)


@router.put("/v1/conversations/{conversation_id}", responses=_ERRORS)
async def replace_conversation(
    request: Request,
    conversation_id: ConvId,
    body: ReplaceRequest,
    tenant: Tenant,
    svc: Svc,
    background: BackgroundTasks,
) -> ConversationState:
    """Replace the whole conversation (edits, regenerations); creates it if absent."""
    write = Conversations(svc).replace
    return await _write(request, conversation_id, body, tenant, svc, background, write)


async def _write(
    request: Request,
    conversation_id: str,
    body: AppendRequest | ReplaceRequest,
    tenant: str,
    svc: Services,
    background: BackgroundTasks,
    write: Callable[[str, str, Any, Window], Sizes],
) -> ConversationState:
    """An append or a replace: limits, window, the store write, then the summary trigger."""
    rec = request_log(request)
    rec.conversation_id = conversation_id
    _limit(svc, messages=body.messages, system=body.system, tools=body.tools)
    window = resolve_window(svc.settings, body.model, body.max_input_tokens)
    sizes = await run_in_threadpool(write, tenant, conversation_id, body, window)
    _after(rec, sizes, background, svc)
    return _state(conversation_id, sizes)


@router.get("/v1/conversations/{conversation_id}", responses=_CONV_ERRORS)
async def get_conversation(
    request: Request, conversation_id: ConvId, tenant: Tenant, svc: Svc
) -> ConversationInfo:
    """Length, tokens, model and the summary records (no text)."""
    request_log(request).conversation_id = conversation_id
    info: ConversationInfo = await run_in_threadpool(
        Conversations(svc).info, tenant, conversation_id
    )
    return info


@router.delete("/v1/conversations/{conversation_id}", status_code=204, responses=_ERRORS)
async def delete_conversation(
    request: Request, conversation_id: ConvId, tenant: Tenant, svc: Svc
) -> Response:
    """Erase the conversation and its summaries (204 whether or not it existed)."""
    request_log(request).conversation_id = conversation_id
    await run_in_threadpool(Conversations(svc).delete, tenant, conversation_id)
    return Response(status_code=204)


@router.post(
    "/v1/conversations/{conversation_id}/prepare",
    response_model=PrepareResponse,
    responses=_CONV_ERRORS,
)
async def prepare_conversation(
    request: Request,
    conversation_id: ConvId,
    body: PrepareStoredRequest,
    tenant: Tenant,
    svc: Svc,
    background: BackgroundTasks,
) -> Response:
    """The messages to send now for a stored conversation (never calls an LLM)."""
    rec = request_log(request)
    rec.conversation_id = conversation_id
    _limit(svc, tools=body.tools)
    window = resolve_window(svc.settings, body.model, body.max_input_tokens)
    content, pending = await Preparer(svc).stored(
        tenant, conversation_id, body, window, rec, request
    )
    if pending is not None:
        background.add_task(svc.scheduler.send, pending)
    return Response(content, media_type=JSON, background=background)


@router.post("/v1/prepare", response_model=PrepareResponse, responses=_ERRORS)
async def prepare_messages(
    request: Request, body: PrepareRequest, tenant: Tenant, svc: Svc
) -> Response:
    """Stateless prepare of the given messages; answers `degraded` without Redis."""
    rec = request_log(request)
    _limit(svc, messages=body.messages, system=body.system, tools=body.tools)
    window = resolve_window(svc.settings, body.model, body.max_input_tokens)
    content = await Preparer(svc).stateless(tenant, body, window, rec)
    return Response(content, media_type=JSON)


@router.post("/v1/observe", status_code=204, responses=_ERRORS)
async def observe(request: Request, body: ObserveRequest, tenant: Tenant, svc: Svc) -> Response:
    """Calibrate on the provider's own prompt-token count for what was sent."""
    _limit(svc, messages=body.messages, system=body.system, tools=body.tools)
    await Preparer(svc).observe(tenant, body)
    return Response(status_code=204)


INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>prefit</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 2em auto">
<h1>prefit</h1>
<p>Keeps long LLM conversations inside the model's input window, with summaries computed
ahead of time.</p>
<ul>
<li><a href="/docs">/docs</a>: the API, interactive (<a href="/openapi.json">OpenAPI</a>)</li>
<li>Drop-in proxy: point the OpenAI SDK at <code>/v1</code>, the Anthropic SDK at
<code>/</code> (<code>POST /v1/chat/completions</code>, <code>POST /v1/messages</code>)</li>
<li><a href="/healthz">/healthz</a>, <a href="/readyz">/readyz</a>,
<a href="/metrics">/metrics</a></li>
</ul>
</body></html>
"""


@router.get("/", include_in_schema=False)
async def index() -> HTMLResponse:
    """A short page for whoever opens the service in a browser: where the docs are."""
    return HTMLResponse(INDEX)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorResponse}})
async def readyz(svc: Svc) -> Response:
    """Readiness: Redis and the broker answer (within half the request deadline).

    `summarizer` (the workers' breakers) is detail: the API serves whatever their state.
    """
    limit = svc.settings.request_deadline_s / 2
    redis_ok, broker_ok = await asyncio.gather(
        _probe(svc.store.ping, limit), _probe(partial(_ping, svc), limit)
    )
    summarizer = await _summarizer(svc, limit) if redis_ok else None
    body: dict[str, Any] = {"redis": redis_ok, "broker": broker_ok, "summarizer": summarizer}
    if redis_ok and broker_ok:
        return Response(_dumps({"status": "ok", **body}), media_type=JSON)
    down = " and ".join(n for n, ok in (("redis", redis_ok), ("broker", broker_ok)) if not ok)
    error = {"type": "StoreUnavailable", "message": f"{down} unreachable"}
    return Response(
        _dumps({"error": error, **body}),
        status_code=503,
        media_type=JSON,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


@router.get("/metrics", responses={401: {"model": ErrorResponse}})
async def metrics(request: Request, svc: Svc) -> Response:
    """Prometheus metrics; per-tenant series only with `Bearer <PREFIT_METRICS_TOKEN>`."""
    token = svc.settings.metrics_token
    render = partial(
        svc.metrics.render, per_tenant=metrics_access(token, request.headers.get("authorization"))
    )
    try:  # Redis gets half the deadline; past it the store is reported down
        content = await within(run_in_threadpool(render), svc.settings.request_deadline_s / 2)
    except TimeoutError:
        content = render(store=False)
    return Response(content, media_type=CONTENT_TYPE_LATEST)


async def _probe(ping: Callable[[], bool], limit: float) -> bool:
    """`ping()` in the threadpool; False if it fails or takes longer than `limit` seconds."""
    try:
        return await within(run_in_threadpool(ping), limit)
    except TimeoutError:
        return False


def _ping(svc: Services) -> bool:
    try:
        return bool(svc.broker().ping())
    except Exception:
        return False


async def _summarizer(svc: Services, limit: float) -> dict[str, Any] | None:
    try:
        return overall(await within(run_in_threadpool(svc.store.breakers.all), limit))
    except Exception:  # detail only (readiness is Redis and the broker), timeouts included
        return None


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()
