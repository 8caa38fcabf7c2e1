"""The provider endpoints the proxy passes through unfitted, and those it does not serve.

Clients pointed at prefit by a base URL (`OPENAI_BASE_URL`) send it every call of their SDK,
not only chat: frameworks list the models at start-up (`GET /v1/models`, also Anthropic's,
told apart by the `anthropic-version` header its SDK always sends) and embed through the
same base URL (`POST /v1/embeddings`), and Responses clients read and delete the responses
the provider stored, cancel background ones and compact (`/v1/responses/{id}`, ...). Those
have no conversation to fit: they go to the provider as they came (the deployment's key in
place of prefit's), and its answer comes back as it is. Other provider endpoints (legacy
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
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from api.codec import dumps
from api.deps import Services
from api.logging import request_log
from api.proxy.dialects import Dialect
from api.proxy.headers import passed_back, upstream_headers
from api.proxy.identity import identify
from shared.errors import NotFound
from shared.logs import get_logger

log = get_logger(__name__)

SERVED = (
    "/v1/chat/completions and /v1/responses (OpenAI), /v1/messages (Anthropic), /v1/models, "
    "/v1/embeddings"
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


async def forward(request: Request, dialect: Dialect, path: str) -> Response:
    """`request` to `dialect`'s upstream at `path` (under /v1), answered as it came;
    `PrefitError` for a caller prefit does not know."""
    svc: Services = request.app.state.services
    rec = request_log(request)
    caller = identify(request.headers, svc.keyring, svc.settings)
    rec.tenant = caller.tenant
    body = await request.body()
    key = svc.transport.upstreams[dialect.name].key
    headers = upstream_headers(dialect, caller, key, request.headers)
    if not body:
        headers.pop("content-type")
    query = f"?{request.url.query}" if request.url.query else ""
    try:
        answer = await svc.transport.forward(
            dialect.name, request.method, path + query, headers, body
        )
    except httpx.TransportError as exc:
        timeout = isinstance(exc, httpx.TimeoutException)
        status = 504 if timeout else 502
        rec.error = "UpstreamTimeout" if timeout else "UpstreamUnreachable"
        log.warning("proxy.upstream_failed", upstream=dialect.name, error=type(exc).__name__)
        problem = "timed out" if timeout else "unreachable"
        return _error(dialect, status, f"{dialect.name} upstream {problem}")
    rec.upstream_status = answer.status_code
    return Response(
        answer.content, status_code=answer.status_code, headers=passed_back(answer.headers)
    )


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


def _error(dialect: Dialect, status: int, message: str) -> Response:
    return Response(
        dumps(dialect.error(status, message)),
        status_code=status,
        media_type="application/json",
    )
