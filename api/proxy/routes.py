"""The proxy's routes: which provider endpoints are fitted, passed through, or refused.

Fitted: `POST /v1/chat/completions` (api/proxy/dialects/openai.py), `POST /v1/messages` and
its `/count_tokens` (dialects/anthropic.py), `POST /v1/responses` and its `/input_tokens`
(dialects/responses.py), Gemini's `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent` and `:countTokens` (dialects/gemini.py; also under `/v1` and
`/v1alpha`), each relayed by api/proxy/relay.py; `POST /v1/responses/compact` is answered
by prefit itself (api/proxy/compaction.py). They take the provider's own
request body and answer the provider's own response, so they stay out of prefit's OpenAPI
schema (docs/api.md, "Drop-in proxy", documents them). Errors of prefit itself (no or a
wrong key, a body that is not a JSON object, a bad conversation header) are shaped as the
provider shapes its errors, so the SDKs raise their usual types.

Passed through unfitted (`forward`), or refused: clients pointed at prefit by a base URL
(`OPENAI_BASE_URL`) send it every call of their SDK, not only chat: frameworks list the
models at start-up (`GET /v1/models`, also Anthropic's, told apart by the
`anthropic-version` header its SDK always sends) and embed through the same base URL
(`POST /v1/embeddings`), and Responses clients read and delete the responses the provider
stored and cancel background ones (`/v1/responses/{id}`, ...). Those have no
conversation to fit: each route reaches the one provider endpoint it names, rebuilt from
validated ids and documented query parameters, never from the raw path
(api/proxy/endpoints.py); the body (strict JSON) goes as it came, the deployment's key in
place of prefit's, and the provider's answer comes back as it is. A stored response is
reached only by the tenant whose request created it (api/proxy/dialects/responses.py).
Other provider endpoints (legacy
completions, stored chat completions, ...) are answered with a 404 in the provider's error
shape saying what prefit serves, so the SDK raises `NotFoundError` with a message that
explains it.

Any other route (`unknown_route`) is answered the same way, shaped as the caller's API
shapes its errors: Gemini's (`{"error": {"code", "message", "status"}}`) for its paths
(`/v1beta/...`, `...:generateContent`) or `x-goog-api-key`, Anthropic's when the
`anthropic-version` header says so, OpenAI's for OpenAI's endpoints (`/v1/files`,
`/v1/audio/...`), and prefit's own otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from starlette.routing import Match

from api.codec import dumps, loads
from api.deadline import upstream_wait
from api.deps import Services
from api.errors import RETRY_AFTER_S, status_of
from api.proxy.compaction import CompactRelay
from api.proxy.dialects import Dialect
from api.proxy.dialects.gemini import VERSIONS, GeminiRelay, keyed
from api.proxy.dialects.responses import ResponsesCountRelay, ResponsesRelay
from api.proxy.endpoints import (
    CANCEL,
    EMBEDDINGS,
    INPUT_ITEMS,
    MODEL,
    MODELS,
    RESPONSE,
    Passage,
)
from api.proxy.identity import identify
from api.proxy.owners import RESPONSES, owned_response
from api.proxy.relay import CountRelay, Relay
from api.proxy.services import ProxyServices, proxy_services
from api.proxy.upstream import own_key, passed_back, upstream_failure, upstream_headers
from api.requestlog import request_log
from shared.errors import InvalidRequest, NotFound, OverShare, PrefitError

router = APIRouter()
# included after every other router: the answer for a route nobody serves
fallback = APIRouter()
_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]

SERVED = (
    "/v1/chat/completions and /v1/responses (OpenAI), /v1/messages (Anthropic), "
    "/v1beta/models/{model}:generateContent, :streamGenerateContent and :countTokens "
    "(Gemini), /v1/models, /v1/embeddings"
)
OWN_API = "/v1/prepare, /v1/conversations/... (prefit's own API, docs/api.md)"

# Gemini's API: its versions (`/v1beta/...`) and its `model:verb` calls
_GEMINI_PATH = re.compile(r"^/(?:upload/)?v1(?:alpha|beta)\d*/|:[a-zA-Z]+(?:Contents?|Tokens)$")
# OpenAI's endpoint families besides the ones prefit serves or passes through
_OPENAI_FAMILIES = frozenset(
    {
        "assistants", "audio", "batches", "chatkit", "containers", "edits", "engines", "evals",
        "files", "fine-tunes", "fine_tuning", "images", "moderations", "organization",
        "realtime", "threads", "uploads", "vector_stores", "videos",
    }
)  # fmt: skip


@router.post("/v1/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    """OpenAI Chat Completions, with the messages fitted to the model's window."""
    return await proxy(request, proxy_services(request).openai)


@router.post("/v1/messages", include_in_schema=False)
async def messages(request: Request) -> Response:
    """Anthropic Messages, with the system and messages fitted to the model's window."""
    return await proxy(request, proxy_services(request).anthropic)


@router.post("/v1/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> Response:
    """Anthropic's token count of the prompt as prefit would send it (fitted, then counted)."""
    return await proxy(request, proxy_services(request).anthropic, CountRelay)


@router.api_route("/v1/messages/{rest:path}", methods=_ANY, include_in_schema=False)
async def messages_other(request: Request, rest: str) -> Response:
    """Anything else under `/v1/messages` (message batches, ...): an Anthropic 404."""
    message = (
        f"prefit's proxy does not serve /v1/messages/{rest}: it serves POST /v1/messages and "
        "POST /v1/messages/count_tokens (send message batches to the provider directly)"
    )
    return _error(request, proxy_services(request).anthropic, NotFound(message))


@router.post("/v1/responses", include_in_schema=False)
async def responses(request: Request) -> Response:
    """OpenAI Responses, with the instructions and input items fitted to the model's window."""
    return await proxy(request, proxy_services(request).responses, ResponsesRelay)


@router.post("/v1/responses/input_tokens", include_in_schema=False)
async def responses_input_tokens(request: Request) -> Response:
    """OpenAI's token count of the input as prefit would send it (fitted, then counted)."""
    dialect = proxy_services(request).responses
    return await proxy(request, dialect, ResponsesCountRelay, model_required=False)


@router.post("/v1/responses/compact", include_in_schema=False)
async def responses_compact(request: Request) -> Response:
    """OpenAI's compaction, answered by prefit from the summary made ahead, never forwarded
    (api/proxy/compaction.py)."""
    return await proxy(request, proxy_services(request).responses, CompactRelay)


@router.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"], include_in_schema=False)
async def response_stored(request: Request) -> Response:
    """One of the provider's stored responses (retrieve, delete), the caller's own only."""
    openai = proxy_services(request).openai
    return await _shaped(request, openai, forward(request, openai, RESPONSE, owned=True))


@router.get("/v1/responses/{response_id}/input_items", include_in_schema=False)
async def response_input_items(request: Request) -> Response:
    """A stored response's input items, the caller's own only."""
    openai = proxy_services(request).openai
    return await _shaped(request, openai, forward(request, openai, INPUT_ITEMS, owned=True))


@router.post("/v1/responses/{response_id}/cancel", include_in_schema=False)
async def response_cancel(request: Request) -> Response:
    """A background response cancelled, the caller's own only."""
    openai = proxy_services(request).openai
    return await _shaped(request, openai, forward(request, openai, CANCEL, owned=True))


@router.post("/{version}/models/{model}:generateContent", include_in_schema=False)
@router.post("/{version}/models/{model}:streamGenerateContent", include_in_schema=False)
async def gemini_generate(request: Request, version: str) -> Response:
    """Gemini's generateContent (streamed with `alt=sse` or not), the contents fitted."""
    return await _gemini(request, version, GeminiRelay)


@router.post("/{version}/models/{model}:countTokens", include_in_schema=False)
async def gemini_count_tokens(request: Request, version: str) -> Response:
    """Gemini's token count of the contents as prefit would send them (fitted, then counted)."""
    return await _gemini(request, version, CountRelay)


async def _gemini(request: Request, version: str, relay_type: Callable[..., Relay]) -> Response:
    found = proxy_services(request)
    if version not in VERSIONS:
        return unknown_route(request, found.openai, found.anthropic)
    headers = keyed(request.headers, request.url.query)  # `?key=` is the caller's key too
    dialect = found.gemini
    answer = _relayed(request, dialect, relay_type, model_required=False, headers=headers)
    return await _shaped(request, dialect, answer)


@router.get("/v1/models", include_in_schema=False)
async def models(request: Request) -> Response:
    """The provider's model list (Anthropic's when the SDK sends `anthropic-version`)."""
    return await _passed(request, MODELS)


@router.get("/v1/models/{model_id:path}", include_in_schema=False)
async def model(request: Request, model_id: str) -> Response:
    """One model of the provider's list (models are public: no owner)."""
    return await _passed(request, MODEL)


@router.post("/v1/embeddings", include_in_schema=False)
async def embeddings(request: Request) -> Response:
    """OpenAI embeddings, passed through: there is no conversation to fit."""
    openai = proxy_services(request).openai
    return await _shaped(request, openai, forward(request, openai, EMBEDDINGS))


@router.api_route("/v1/responses/{rest:path}", methods=_ANY, include_in_schema=False)
@router.api_route(
    "/v1/responses", methods=["GET", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
@router.api_route("/v1/completions", methods=_ANY, include_in_schema=False)
@router.api_route("/v1/chat/completions/{rest:path}", methods=_ANY, include_in_schema=False)
@router.get("/v1/chat/completions", include_in_schema=False)
async def not_served_here(request: Request) -> Response:
    """Provider endpoints prefit does not serve: a 404 the SDK reads."""
    return _error(request, proxy_services(request).openai, not_served(request))


@fallback.api_route("/{rest:path}", methods=_ANY, include_in_schema=False)
async def unknown(request: Request, rest: str) -> Response:
    """Any other route: a 404 in the caller's API's shape saying what prefit serves (a route
    that exists for other methods is still a 405, but to a Gemini call, which is none)."""
    routes = _flat(request.app.router.routes)
    allowed = {
        m for r in routes if r.matches(request.scope)[0] == Match.PARTIAL for m in _methods(r)
    }
    if allowed and not gemini(request):
        allowed |= {"HEAD"} if "GET" in allowed else set()  # api/head.py serves it
        raise HTTPException(405, headers={"Allow": ", ".join(sorted(allowed))})
    found = proxy_services(request)
    return unknown_route(request, found.openai, found.anthropic)


def _methods(route: Any) -> set[str]:
    return set(getattr(route, "methods", None) or ())


def _flat(routes: list[Any]) -> list[Any]:
    """Every route, those of included routers too (FastAPI keeps a router included whole)."""
    out: list[Any] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out.extend(_flat(inner.routes) if inner is not None else [route])
    return out


async def proxy(
    request: Request,
    dialect: Dialect,
    relay_type: Callable[..., Relay] = Relay,
    *,
    model_required: bool = True,
) -> Response:
    """Authenticate, read the body, and relay it (prefit's own errors in `dialect`'s shape)."""
    return await _shaped(request, dialect, _relayed(request, dialect, relay_type, model_required))


async def _relayed(
    request: Request,
    dialect: Dialect,
    relay_type: Callable[..., Relay],
    model_required: bool,
    headers: Mapping[str, str] | None = None,
) -> Response:
    svc: Services = request.app.state.services
    found = proxy_services(request)
    rec = request_log(request)
    headers = request.headers if headers is None else headers
    caller = identify(headers, svc.keyring, svc.settings)
    rec.tenant = caller.tenant
    raw = await request.body()
    body, learn = _object(found, raw, caller.tenant, model_required)
    asked = dialect.asked(request.url.path, request.url.query, body)
    relay = relay_type(svc, found, dialect, asked, caller, body, raw, headers, rec)
    answer = await relay.run()
    if learn:  # after the answer and its sync: where this body's messages end, for the next
        relay.background.add_task(found.bodies.remember, caller.tenant, raw, body)
    elif dialect is found.openai and relay.fitter is not None:  # its messages as they came
        found.bodies.adopt(caller.tenant, raw, relay.fitter.messages)
    return answer


async def _passed(request: Request, passage: Passage) -> Response:
    found = proxy_services(request)
    dialect: Dialect = found.anthropic if "anthropic-version" in request.headers else found.openai
    return await _shaped(request, dialect, forward(request, dialect, passage))


async def _shaped(request: Request, dialect: Dialect, answer: Awaitable[Response]) -> Response:
    """`answer`, or prefit's own error in `dialect`'s shape."""
    try:
        return await answer
    except PrefitError as exc:
        return _error(request, dialect, exc)


def _error(request: Request, dialect: Dialect, exc: PrefitError) -> Response:
    request_log(request).error = type(exc).__name__
    status = status_of(exc)
    status = 400 if status == 422 else status  # providers answer bad requests with 400
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}
    if isinstance(exc, OverShare):
        headers = {"Retry-After": str(exc.retry_after)}
    return JSONResponse(dialect.error(status, str(exc)), status_code=status, headers=headers)


def _object(
    found: ProxyServices, raw: bytes, tenant: str, model_required: bool = True
) -> tuple[dict[str, Any], bool]:
    """The request body, a JSON object naming a model (when it must, or names one), parsed
    from where it differs from the tenant's last like it (`ResentBodies`), and whether to
    learn its messages."""
    try:
        body, learn = found.bodies.loads(tenant, raw)
    except ValueError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if (model_required or "model" in body) and (
        not isinstance(body.get("model"), str) or not body["model"]
    ):
        raise InvalidRequest("'model' must be a non-empty string")
    return body, learn


async def forward(
    request: Request, dialect: Dialect, passage: Passage, *, owned: bool = False
) -> Response:
    """`request` to the one endpoint of `dialect`'s upstream that `passage` names, rebuilt
    from its validated ids and documented query (api/proxy/endpoints.py), answered as it
    came; an `owned` passage's response must be one the caller created (else the provider's
    404, the provider never asked). `PrefitError` for a caller prefit does not know, a path
    that is not exactly the passage's, or a body that is not strict JSON."""
    svc: Services = request.app.state.services
    found = proxy_services(request)
    rec = request_log(request)
    caller = identify(request.headers, svc.keyring, svc.settings)
    rec.tenant = caller.tenant
    rebuilt = passage.upstream(request.scope)
    if rebuilt is None:
        raise not_served(request)
    path, ids = rebuilt
    checked = owned and not own_key(dialect, caller)
    if checked:
        await owned_response(svc, found, caller.tenant, ids["response_id"])
    body = await request.body()
    if body:
        _strict(body)
    headers = upstream_headers(dialect, caller, dialect.upstream.key, request.headers)
    if not body:
        headers.pop("content-type")
    try:
        async with upstream_wait():  # the provider's time, not prefit's deadline
            answer = await found.clients.request(
                dialect.upstream, request.method, path, headers, body, tenant=caller.tenant
            )
    except httpx.TransportError as exc:
        status, message = upstream_failure(exc, dialect.name, rec)
        return Response(
            dumps(dialect.error(status, message)),
            status_code=status,
            media_type="application/json",
        )
    rec.upstream_status = answer.status_code
    if checked and request.method == "DELETE" and answer.status_code < 300:
        await found.owned.forget(
            svc.increments().client, caller.tenant, RESPONSES, ids["response_id"]
        )
    return Response(
        answer.content, status_code=answer.status_code, headers=passed_back(answer.headers)
    )


def _strict(body: bytes) -> None:
    """`InvalidRequest` unless `body` is strict JSON (api/codec.py): nothing else goes up."""
    try:
        loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def not_served(request: Request) -> NotFound:
    """The error for a provider endpoint prefit does not serve."""
    return NotFound(
        f"prefit's proxy does not serve {request.method} {request.url.path}: it serves "
        f"{SERVED}; call other endpoints at the provider itself"
    )


def gemini(request: Request) -> bool:
    """Whether `request` is a call of Gemini's API (by its path or its key header)."""
    return bool(_GEMINI_PATH.search(request.url.path)) or "x-goog-api-key" in request.headers


def unknown_route(request: Request, openai: Dialect, anthropic: Dialect) -> Response:
    """A 404 for a route nobody serves, in the caller's API's error shape (module docstring)."""
    path, headers = request.url.path, request.headers
    message = (
        f"prefit does not serve {request.method} {path}: its proxy serves {SERVED}, and "
        f"{OWN_API}; call other endpoints at the provider itself"
    )
    body: dict[str, Any]
    if gemini(request):
        body = {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}
    elif "anthropic-version" in headers:
        body = anthropic.error(404, message)
    elif path.startswith("/v1/") and path.split("/")[2] in _OPENAI_FAMILIES:
        body = openai.error(404, message)
    else:
        body = {"error": {"type": "NotFound", "message": message}}
    request_log(request).error = "NotFound"
    return JSONResponse(body, status_code=404)
