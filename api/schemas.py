"""Request and response bodies of the HTTP API (pydantic only here, at the edge).

Messages stay plain JSON objects: their validation is the core's (`shared.messages.validate`,
`shared.formats.anthropic`), which names the failing message and the reason. Unknown fields are
refused, so a misspelt `expected_length` cannot silently turn off the length check. Numbers
are not coerced from strings or booleans (`"5"` and `true` are refused, not read as 5 and 1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from shared.strategies.work import MIN_PRESSURE

Format = Literal["openai", "anthropic"]
System = str | list[dict[str, Any]] | None
MAX_WAIT_MS = 60_000
CONVERSATION_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def _number(value: Any) -> Any:
    """Refuse what pydantic's lax mode would read as a number: strings and booleans."""
    if isinstance(value, str | bool):
        raise ValueError(f"must be a JSON number, got {type(value).__name__}")
    return value


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Model(_Strict):
    model: str = Field(
        min_length=1, max_length=256, description="model name (its window: PREFIT_MODELS)"
    )
    max_input_tokens: Int | None = Field(
        default=None,
        gt=0,
        le=100_000_000,
        description="the model's input window, overriding PREFIT_MODELS",
    )
    format: Format = "openai"


class _Transcript(_Model):
    messages: list[dict[str, Any]]
    system: System = Field(
        default=None, description="Anthropic top-level system (format 'anthropic' only)"
    )
    tools: list[dict[str, Any]] | None = None


class AppendRequest(_Transcript):
    """`POST /v1/conversations/{id}/messages`: new turn(s) for the conversation."""

    expected_length: Int | None = Field(
        default=None, ge=0, description="refuse (409) unless the stored length is this"
    )


class ReplaceRequest(_Transcript):
    """`PUT /v1/conversations/{id}`: the whole conversation (edits, regenerations)."""

    expected_length: Int | None = Field(default=None, ge=0)


class PrepareStoredRequest(_Model):
    """`POST /v1/conversations/{id}/prepare`."""

    tools: list[dict[str, Any]] | None = None
    pressure: Float = Field(default=1.0, ge=MIN_PRESSURE, le=1.0)
    wait_ms: Int | None = Field(
        default=None, ge=0, le=MAX_WAIT_MS, description="wait this long for a due summary"
    )


class PrepareRequest(_Transcript):
    """`POST /v1/prepare`: stateless."""

    pressure: Float = Field(default=1.0, ge=MIN_PRESSURE, le=1.0)


class ObserveRequest(_Strict):
    """`POST /v1/observe`: what was sent and the provider's own prompt-token count."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    actual_prompt_tokens: Int = Field(gt=0, le=100_000_000)
    format: Format = "openai"
    system: System = None


class ConversationState(BaseModel):
    """The answer of append and replace."""

    conversation_id: str
    length: int
    tokens: int = Field(description="estimated tokens of the whole stored transcript (+ tools)")
    effective_tokens: int = Field(description="tokens of the prompt built from the best summary")
    state: Literal["under", "nearing", "over"]


class SummaryInfo(BaseModel):
    upto: int
    prefix_hash: str
    tokens: int
    age_s: float
    summarizer: str


class ConversationInfo(BaseModel):
    """The answer of `GET /v1/conversations/{id}`."""

    conversation_id: str
    length: int
    tokens: int
    effective_tokens: int
    model: str | None
    summaries: list[SummaryInfo]


class PrepareResponse(BaseModel):
    """The messages to send now, their estimated tokens and what was done."""

    messages: list[dict[str, Any]]
    tokens: int
    report: dict[str, Any]
    system: System = None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail
