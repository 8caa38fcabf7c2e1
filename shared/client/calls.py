"""What the prefit client sends and gets back: request specs, typed results, typed errors.

Transport-free, so the sync and the async client share every byte of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from shared import errors
from shared.errors import (
    ConfigError,
    DoesNotFit,
    InvalidId,
    InvalidRequest,
    InvalidTranscript,
    LengthMismatch,
    LLMError,
    NotFound,
    PrefitError,
    RetryableLLMError,
    ServiceUnavailable,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
)
from shared.messages import Message, ToolSpec

T = TypeVar("T")
# The service's conversation ids (api/schemas.py CONVERSATION_ID). Checked here because some
# could not even reach their route: '.' and '..' are path segments httpx resolves away, so
# append("..") would be sent to POST /v1/messages, and '/' (even quoted) splits the path.
_CONV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class AppendResult:
    """A conversation's state after an append or replace."""

    conversation_id: str
    length: int
    tokens: int  # the whole stored transcript (+ tools), calibrated
    effective_tokens: int  # the prompt prepare starts from: head + best summary + the rest
    state: str  # "under" | "nearing" | "over", measured on effective_tokens

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AppendResult:
        return cls(
            str(d["conversation_id"]),
            int(d["length"]),
            int(d["tokens"]),
            _effective(d),
            str(d["state"]),
        )


def _effective(d: dict[str, Any]) -> int:
    """`effective_tokens` (a service from before it was reported: the whole transcript's)."""
    return int(d.get("effective_tokens", d["tokens"]))


@dataclass(frozen=True)
class SummaryInfo:
    """One stored summary record, as the service describes it (no text)."""

    upto: int
    prefix_hash: str
    tokens: int
    age_s: float
    summarizer: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SummaryInfo:
        return cls(
            int(d["upto"]),
            str(d["prefix_hash"]),
            int(d.get("tokens", 0)),
            float(d.get("age_s", 0.0)),
            str(d.get("summarizer", "")),
        )


@dataclass(frozen=True)
class ConversationInfo:
    """A stored conversation: size, model and the summaries known for it."""

    conversation_id: str
    length: int
    tokens: int
    effective_tokens: int
    model: str | None
    summaries: tuple[SummaryInfo, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ConversationInfo:
        return cls(
            str(d["conversation_id"]),
            int(d["length"]),
            int(d["tokens"]),
            _effective(d),
            d.get("model"),
            tuple(SummaryInfo.from_json(s) for s in d.get("summaries") or ()),
        )


@dataclass(frozen=True)
class PreparedPrompt:
    """The messages to send now; `system` is set when the format is Anthropic."""

    messages: list[Message]
    tokens: int
    report: dict[str, Any]
    system: Any = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreparedPrompt:
        return cls(
            list(d["messages"]), int(d["tokens"]), dict(d.get("report") or {}), d.get("system")
        )


@dataclass(frozen=True)
class Health:
    """The answer of `/healthz`; status 0 means the service could not be reached."""

    ok: bool
    status: int
    detail: dict[str, Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str
    body: dict[str, Any] | None
    parse: Callable[[Any], T]
    idempotent: bool  # safe to repeat after a send that may have reached the service
    wait_s: float = 0.0  # the service may hold the answer this long (prepare's wait_ms)

    def finish(self, response: httpx.Response) -> T:
        """The parsed result of a final response, or its typed error."""
        if not response.is_success:
            raise error_from_response(response)
        try:
            return self.parse(response.json() if response.content else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise PrefitError(
                f"unexpected response to {self.method} {self.path}: {exc!r}"
            ) from None


def _none(_: Any) -> None:
    return None


def _conv_path(conv_id: str) -> str:
    if not isinstance(conv_id, str) or not _CONV_ID.fullmatch(conv_id):
        shown = repr(conv_id)[:140]
        raise InvalidId(
            f"invalid conversation id {shown}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return f"/v1/conversations/{quote(conv_id, safe='')}"


def _pressure_sent(pressure: float) -> float:
    """`pressure` as sent: NaN and infinities are not JSON, so say so before sending."""
    if isinstance(pressure, int | float) and not math.isfinite(pressure):
        raise InvalidRequest(f"pressure must be a finite number in [0.001, 1], got {pressure}")
    return pressure


def _transcript_body(
    messages: Sequence[Message],
    model: str,
    max_input_tokens: int | None,
    tools: Sequence[ToolSpec],
    format: str,
    system: Any,
) -> dict[str, Any]:
    if system is not None and format != "anthropic":
        raise ConfigError("'system' is only sent with format='anthropic'")
    body: dict[str, Any] = {"messages": list(messages), "model": model}
    optional = {"max_input_tokens": max_input_tokens, "system": system}
    body.update({k: v for k, v in optional.items() if v is not None})
    if tools:
        body["tools"] = list(tools)
    if format != "openai":
        body["format"] = format
    return body


def append_call(
    conv_id: str,
    messages: Sequence[Message],
    model: str,
    expected_length: int | None,
    max_input_tokens: int | None,
    tools: Sequence[ToolSpec],
    format: str,
    system: Any,
) -> Call[AppendResult]:
    body = _transcript_body(messages, model, max_input_tokens, tools, format, system)
    if expected_length is not None:
        body["expected_length"] = expected_length
    path = f"{_conv_path(conv_id)}/messages"
    return Call("POST", path, body, AppendResult.from_json, expected_length is not None)


def replace_call(
    conv_id: str,
    messages: Sequence[Message],
    model: str,
    max_input_tokens: int | None,
    tools: Sequence[ToolSpec],
    format: str,
    system: Any,
    expected_length: int | None = None,
) -> Call[AppendResult]:
    body = _transcript_body(messages, model, max_input_tokens, tools, format, system)
    if expected_length is not None:
        body["expected_length"] = expected_length
    return Call("PUT", _conv_path(conv_id), body, AppendResult.from_json, True)


def get_call(conv_id: str) -> Call[ConversationInfo]:
    return Call("GET", _conv_path(conv_id), None, ConversationInfo.from_json, True)


def delete_call(conv_id: str) -> Call[None]:
    return Call("DELETE", _conv_path(conv_id), None, _none, True)


def prepare_call(
    conv_id: str,
    model: str,
    tools: Sequence[ToolSpec],
    pressure: float,
    wait_ms: int | None,
    max_input_tokens: int | None,
    format: str,
) -> Call[PreparedPrompt]:
    body: dict[str, Any] = {"model": model, "pressure": _pressure_sent(pressure)}
    if wait_ms is not None:  # else the service's PREFIT_DEFAULT_WAIT_MS applies
        body["wait_ms"] = wait_ms
    if tools:
        body["tools"] = list(tools)
    if max_input_tokens is not None:
        body["max_input_tokens"] = max_input_tokens
    if format != "openai":
        body["format"] = format
    path = f"{_conv_path(conv_id)}/prepare"
    wait_s = wait_ms / 1000 if isinstance(wait_ms, int) and wait_ms > 0 else 0.0
    return Call("POST", path, body, PreparedPrompt.from_json, True, wait_s)


def prepare_messages_call(
    messages: Sequence[Message],
    model: str,
    tools: Sequence[ToolSpec],
    pressure: float,
    max_input_tokens: int | None,
    format: str,
    system: Any,
) -> Call[PreparedPrompt]:
    body = _transcript_body(messages, model, max_input_tokens, tools, format, system)
    body["pressure"] = _pressure_sent(pressure)
    return Call("POST", "/v1/prepare", body, PreparedPrompt.from_json, True)


def observe_call(
    model: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    actual_prompt_tokens: int,
    format: str = "openai",
    system: Any = None,
) -> Call[None]:
    if system is not None and format != "anthropic":
        raise ConfigError("'system' is only sent with format='anthropic'")
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "actual_prompt_tokens": actual_prompt_tokens,
    }
    if tools:
        body["tools"] = list(tools)
    if format != "openai":
        body["format"] = format
    if system is not None:
        body["system"] = system
    # observing twice would count one measurement twice in the calibration
    return Call("POST", "/v1/observe", body, _none, False)


def health_result(response: httpx.Response) -> Health:
    try:
        detail = response.json()
    except ValueError:
        detail = {}
    return Health(
        response.status_code == 200,
        response.status_code,
        detail if isinstance(detail, dict) else {},
    )


# --- errors ----------------------------------------------------------------------------------

_BY_NAME: dict[str, type[PrefitError]] = {
    name: obj
    for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, PrefitError)
}
_BY_STATUS: dict[int, type[PrefitError]] = {
    401: Unauthorized,
    404: NotFound,
    409: LengthMismatch,
    413: TooLarge,
    422: InvalidTranscript,
    503: StoreUnavailable,
}


def error_from_response(response: httpx.Response) -> PrefitError:
    """The typed error for an error response: by the body's `type`, else by the status code."""
    try:
        body = response.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    message = str(err.get("message") or f"HTTP {response.status_code} {response.reason_phrase}")
    cls = _BY_NAME.get(str(err.get("type"))) or _BY_STATUS.get(response.status_code, PrefitError)
    return _build(cls, message, err)


def _build(cls: type[PrefitError], message: str, err: dict[str, Any]) -> PrefitError:
    exc: PrefitError
    if issubclass(cls, InvalidTranscript):
        index = err.get("index") if isinstance(err.get("index"), int) else None
        reason = err.get("reason")
        if not isinstance(reason, str):
            prefix = f"message {index}: "
            reason = message.removeprefix(prefix) if index is not None else message
        return cls(reason, index)
    if issubclass(cls, LengthMismatch):
        exc = cls(_int(err, "expected"), _int(err, "actual"))
    elif issubclass(cls, DoesNotFit):
        exc = cls(
            tokens=_int(err, "tokens"),
            budget=_int(err, "budget"),
            head_tokens=_int(err, "head_tokens"),
            tail_tokens=_int(err, "tail_tokens"),
            tools_tokens=_int(err, "tools_tokens"),
            other_tokens=_opt_int(err, "other_tokens") or 0,
            floor_chars=_opt_int(err, "floor_chars"),
        )
    elif issubclass(cls, RetryableLLMError):
        retry_after = err.get("retry_after")
        exc = cls(message, status=_opt_int(err, "status"), retry_after=_opt_float(retry_after))
    elif issubclass(cls, LLMError):
        exc = cls(message, status=_opt_int(err, "status"))
    else:
        try:
            exc = cls(message)
        except TypeError:  # a class with a richer constructor than this client knows
            exc = PrefitError(message)
    exc.args = (message,)  # the service's own wording, fields or not
    return exc


def unreachable(base_url: str, exc: Exception, *, sent: bool = False) -> ServiceUnavailable:
    """The error for a service that could not be reached after every retry; `sent`: the
    request may have reached it (a timeout or a dropped connection after sending)."""
    if not sent:
        return ServiceUnavailable(
            f"prefit service at {base_url} unreachable ({type(exc).__name__})"
        )
    return ServiceUnavailable(
        f"no answer from the prefit service at {base_url} ({type(exc).__name__}): the request "
        "may have been applied, so it was not repeated (an append with expected_length is)"
    )


def _int(err: dict[str, Any], key: str) -> int:
    value = err.get(key)
    return value if isinstance(value, int) else -1


def _opt_int(err: dict[str, Any], key: str) -> int | None:
    value = err.get(key)
    return value if isinstance(value, int) else None


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
