"""Errors as responses: `{"error": {"type", "message", ...}}`, one status per error class.

One handler maps the whole `PrefitError` tree (the nearest class in the MRO decides the
status); two more translate the framework's own errors (bad JSON, schema violations,
unknown routes) into the same shape. Anything else is a bug, answered 500 by the request
logger (api/requestlog.py), which logs its type and stack but never its message.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from api.codec import NotStrictJSON
from api.requestlog import CLIENT_CLOSED, DISCONNECTED, request_log
from shared.errors import (
    ConfigError,
    DoesNotFit,
    Forbidden,
    ImplausibleObservation,
    InvalidId,
    InvalidRequest,
    InvalidTranscript,
    LengthMismatch,
    LLMError,
    NotFound,
    OverShare,
    PrefitError,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
    UnknownModel,
    WriteConflict,
)
from shared.logs import get_logger

log = get_logger(__name__)

RETRY_AFTER_S = 1
ID_RULE = "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"

# TooLarge raised inside the app is about counts and string sizes (422); body bytes get
# their 413 from the BodyLimit middleware before the app runs.
STATUS: dict[type[PrefitError], int] = {
    InvalidTranscript: 422,
    InvalidId: 422,
    DoesNotFit: 422,
    UnknownModel: 422,
    ConfigError: 422,
    InvalidRequest: 422,
    ImplausibleObservation: 422,
    TooLarge: 422,
    NotFound: 404,
    OverShare: 429,
    LengthMismatch: 409,
    WriteConflict: 409,
    Unauthorized: 401,
    Forbidden: 403,
    StoreUnavailable: 503,
    LLMError: 503,
}


def status_of(exc: PrefitError) -> int:
    """The HTTP status of an error: that of the nearest mapped class, else 400."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def error_body(exc: PrefitError) -> dict[str, Any]:
    """The `error` object: type, message, and the error's structured fields."""
    body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, InvalidTranscript):
        body["reason"] = exc.reason
        if exc.index is not None:
            body["index"] = exc.index
    elif isinstance(exc, LengthMismatch):
        body.update(expected=exc.expected, actual=exc.actual)
    elif isinstance(exc, DoesNotFit):
        body.update(
            tokens=exc.tokens,
            budget=exc.budget,
            head_tokens=exc.head_tokens,
            tail_tokens=exc.tail_tokens,
            tools_tokens=exc.tools_tokens,
            other_tokens=exc.other_tokens,
            floor_chars=exc.floor_chars,
        )
    return body


def error_response(exc: PrefitError) -> JSONResponse:
    status = status_of(exc)
    headers: dict[str, str] = {}
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    elif isinstance(exc, OverShare):
        headers["Retry-After"] = str(exc.retry_after)
    elif status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error": error_body(exc)}, status_code=status, headers=headers)


async def on_prefit_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PrefitError)
    request_log(request).error = type(exc).__name__
    return error_response(exc)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    if _not_json(exc):  # FastAPI hands the raw bytes on when the content-type is not JSON
        kind = request.headers.get("content-type")
        error = InvalidRequest(
            "request body must be JSON sent with content-type: application/json, got "
            + (f"content-type {kind[:80]!r}" if kind else "no content-type")
        )
        response = await on_prefit_error(request, error)
        response.status_code = 415
        return response
    response = await on_prefit_error(request, _from_validation(exc))
    if _is_bad_json(exc):
        response.status_code = 400
    return response


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's body read: the client left
        request_log(request).error = DISCONNECTED
        return JSONResponse({}, status_code=CLIENT_CLOSED)  # for the log: nobody reads it
    if exc.status_code == 400 and exc.__cause__ is not None:  # the body could not be decoded
        response = await on_prefit_error(request, _undecodable(exc.__cause__))
        response.status_code = 400
        return response
    name = {404: "NotFound", 401: "Unauthorized"}.get(exc.status_code, "InvalidRequest")
    request_log(request).error = name
    body = {"error": {"type": name, "message": str(exc.detail)}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def install(app: FastAPI) -> None:
    """Register every handler on `app`."""
    app.add_exception_handler(PrefitError, on_prefit_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    # Any other exception is a bug: the RequestLogger middleware answers it (api/requestlog.py).


def _from_validation(exc: RequestValidationError) -> PrefitError:
    """The first schema violation as a typed error: messages give their index."""
    first: dict[str, Any] = next(iter(exc.errors()), {})
    loc = [p for p in first.get("loc", ()) if p != "body"]
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", msg)
        return InvalidTranscript(f"request body is not valid JSON: {reason}")
    if loc and loc[0] == "path":
        return InvalidId(f"invalid conversation id {str(first.get('input'))[:140]!r}: {ID_RULE}")
    if not loc:
        return _bad_body(first)
    where = ".".join(str(p) for p in loc)
    if loc[0] == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        detail = ".".join(str(p) for p in loc[2:])
        return InvalidTranscript(f"{detail + ': ' if detail else ''}{msg}", loc[1])
    if loc[0] == "system":  # a union: pydantic names its branches ('system.str')
        return InvalidTranscript("system: must be a string or a list of content blocks")
    if loc[0] in ("messages", "tools"):
        return InvalidTranscript(f"{where}: {msg}")
    return InvalidRequest(f"{where}: {msg}")


def _bad_body(first: dict[str, Any]) -> InvalidRequest:
    """The error for a body that is not an object at all (or absent)."""
    if first.get("type") == "missing":
        return InvalidRequest("request body is missing: send a JSON object")
    got = type(first.get("input")).__name__
    names = {"list": "an array", "str": "a string", "NoneType": "null", "bool": "a boolean"}
    kind = names.get(got, "a number")
    return InvalidRequest(f"request body must be a JSON object, got {kind}")


def _undecodable(cause: BaseException) -> InvalidTranscript:
    """The error for a JSON body the parser gave up on (FastAPI says only 'error parsing')."""
    if isinstance(cause, UnicodeDecodeError):
        why = f"it is not UTF-8 (byte {cause.start})"
    elif isinstance(cause, RecursionError):
        why = "it is nested too deeply"
    elif isinstance(cause, NotStrictJSON):
        why = f"{cause.what} at {cause.where}"
    elif isinstance(cause, ValueError):  # the parsers' own words: positions, never content
        why = str(cause)[:200]
    else:
        why = type(cause).__name__
    return InvalidTranscript(f"request body is not valid JSON: {why}")


def _not_json(exc: RequestValidationError) -> bool:
    """Whether the body arrived as bytes: sent without a JSON content-type."""
    first: dict[str, Any] = next(iter(exc.errors()), {})
    return tuple(first.get("loc", ())) == ("body",) and isinstance(first.get("input"), bytes)


def _is_bad_json(exc: RequestValidationError) -> bool:
    return any(e.get("type") == "json_invalid" for e in exc.errors())
