"""The Gemini API dialect (`models/{model}:generateContent`, `:streamGenerateContent`, ...).

`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse` and
`:countTokens`. The model and the stream are in the path, not the body: as the
google-genai SDK builds it (google/genai/models.py: `'{model}:generateContent'`,
`'{model}:streamGenerateContent?alt=sse'`, `'{model}:countTokens'` under
`{base_url}/{api_version}/`: `v1beta` in Gemini CLI's JS SDK, `v1` in google-genai 3.x,
or `GOOGLE_GENAI_API_VERSION`; every version Gemini serves is taken). The request goes to
the same path under `PREFIT_GEMINI_BASE_URL` (Gemini CLI's `GOOGLE_GEMINI_BASE_URL` points
at prefit the same way), with its query less `key`.

`systemInstruction` and `contents` are converted losslessly to prefit's format
(shared/formats/gemini.py: thoughts, signatures and every part prefit does not know kept
where they were) and the fitted prompt back; every other field (`generationConfig`,
`safetySettings`, `toolConfig`, `cachedContent`, ...) rides along. `tools[].
functionDeclarations` are counted as tool specs; `generationConfig.maxOutputTokens` is the
reply reserved (api/proxy/overflow.py). A `:countTokens` body is `{"contents"}` or
`{"generateContentRequest": {...}}`: the transcript is fitted where it is, the answer's
`totalTokens` observed.

The prompt count is `usageMetadata.promptTokenCount`; a streamed answer (SSE, `data: {...}`
chunks) carries `usageMetadata` on its chunks, the last one final, so the tap keeps the
last it sees. The key is `x-goog-api-key` (the SDK's header, `_api_client.py`) or the
`?key=` query of the REST API (`keyed` moves it into that header before the caller is
identified, so it is never in a URL prefit sends or logs); the deployment's key
(`PREFIT_GEMINI_API_KEY`) goes upstream as `x-goog-api-key`.

An overflow is a 400 `INVALID_ARGUMENT`: "The input token count (1200293) exceeds the
maximum number of tokens allowed (1048576)." (google-gemini/gemini-cli#6678, #4118,
googleapis/python-genai#2466), its figures the prompt's count and the window. Errors are
Gemini's shape, `{"error": {"code", "message", "status"}}`, which the SDK raises as
`errors.ClientError` / `ServerError` (google/genai/errors.py); one inside a stream is a
`data: {"error": ...}` chunk, which the SDK raises too (`_api_client.py`,
`request_streamed`), never an `event:` line it would fail to parse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from api.codec import dumps
from api.proxy.dialects import Asked
from api.proxy.overflow import NUMBER, Overflow, number
from api.proxy.relay import Relay
from api.proxy.streaming import Tap, data_of
from api.proxy.upstream import Upstream, secret
from shared.errors import InvalidRequest, InvalidTranscript
from shared.formats.gemini import gemini_tools, read_gemini, to_gemini
from shared.messages import Message, ToolSpec
from shared.settings import Settings

GEMINI = "gemini"
KEY_HEADER = "x-goog-api-key"
VERSIONS = frozenset({"v1", "v1beta", "v1alpha"})
STREAMED = "streamGenerateContent"
# the model is an id of Gemini's form (the path as decoded: an encoded `/`, `?`, `#` or `%`
# in it is none of those letters), so the endpoint rebuilt from it is the one it names
_PATH = re.compile(
    r"^/(?P<version>[^/]+)/models/(?P<model>[A-Za-z0-9][A-Za-z0-9._-]{0,255}):(?P<verb>[A-Za-z]+)$"
)
_QUERY = frozenset({"alt"})  # what Gemini documents besides `key` (the caller's, never sent)
_USAGE = re.compile(rb'"usageMetadata"')
_OVERFLOW = re.compile(
    rf"input token count \(?{NUMBER}\)? exceeds the maximum number of tokens allowed "
    rf"\(?{NUMBER}\)?"
)
STATUSES = {  # google.rpc codes by HTTP status, as Gemini names them
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def keyed(headers: Mapping[str, str], query: str) -> dict[str, str]:
    """The request's headers, with the `?key=` of its query as `x-goog-api-key` when the
    header is absent (the header wins, as Google's front end reads it first)."""
    out = {k.lower(): v for k, v in headers.items()}
    if KEY_HEADER not in out:
        key = dict(parse_qsl(query, keep_blank_values=True)).get("key")
        if key is not None:
            out[KEY_HEADER] = key
    return out


def prompt_count(usage: Any) -> int | None:
    """`promptTokenCount` of a `usageMetadata` object (cached tokens are included in it)."""
    found = usage.get("promptTokenCount") if isinstance(usage, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def gemini_error(answer: Any) -> dict[str, Any]:
    """The `error` object of a Gemini error body (`{"error"}`, or a list of one, as the
    streaming endpoint answers without `alt=sse`); empty when there is none."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    found = answer.get("error") if isinstance(answer, dict) else None
    return found if isinstance(found, dict) else {}


class UsageMetadataTap:
    """Keeps the last `usageMetadata.promptTokenCount` of a stream; keeps every chunk."""

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None

    def keep(self, event: bytes) -> bool:
        if _USAGE.search(event) is not None:
            data = data_of(event)
            found = prompt_count(data.get("usageMetadata")) if isinstance(data, dict) else None
            if found is not None:
                self.prompt_tokens = found
        return True


class GeminiDialect:
    """The Gemini API."""

    name = GEMINI
    forwarded: tuple[str, ...] = ()

    def __init__(self, settings: Settings) -> None:
        root = settings.gemini_base_url.rstrip("/")
        self.upstream = Upstream(GEMINI, root, secret(settings.gemini_api_key))

    def asked(self, path: str, query: str, body: Mapping[str, Any]) -> Asked:
        found = _PATH.match(path)
        if found is None or found["version"] not in VERSIONS:
            raise InvalidRequest(f"not a Gemini model call: {path}")
        kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k in _QUERY]
        endpoint = path + (f"?{urlencode(kept)}" if kept else "")
        return Asked(found["model"], found["verb"] == STREAMED, endpoint)

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        request = _request(body)
        if "contents" not in request:
            raise InvalidTranscript("'contents' is missing")
        messages, origins = read_gemini(request.get("systemInstruction"), request["contents"])
        try:
            messages = check(messages)
        except InvalidTranscript as exc:  # say which content, not which converted message
            at = origins[exc.index] if exc.index is not None and exc.index < len(origins) else None
            raise InvalidTranscript(
                exc.reason, at if at is not None and at >= 0 else None
            ) from None
        return messages, gemini_tools(request.get("tools"))

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        contents = to_gemini(messages)
        inner = body.get("generateContentRequest")
        if isinstance(inner, dict):
            return {**body, "generateContentRequest": {**inner, "contents": contents}}
        return {**body, "contents": contents}

    def auth(self, key: str) -> dict[str, str]:
        return {KEY_HEADER: key}

    def defaults(self) -> dict[str, str]:
        return {}

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        return None, False  # every chunk carries usageMetadata

    def tap(self, strip: bool) -> Tap:
        return UsageMetadataTap()

    def prompt_tokens(self, answer: Any) -> int | None:
        return prompt_count(answer.get("usageMetadata")) if isinstance(answer, dict) else None

    def counted(self, answer: Any) -> int | None:
        found = answer.get("totalTokens") if isinstance(answer, dict) else None
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        if status != 400:
            return None
        message = gemini_error(answer).get("message")
        found = _OVERFLOW.search(message) if isinstance(message, str) else None
        if found is None:
            return None
        return Overflow(prompt_tokens=number(found.group(1)), limit=number(found.group(2)))

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = STATUSES.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
        return {"error": {"code": status, "message": message, "status": kind}}


def _request(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where a body's transcript is: a `:countTokens` body may wrap a whole request."""
    inner = body.get("generateContentRequest")
    return inner if isinstance(inner, dict) else body


class GeminiRelay(Relay):
    """One Gemini model call: a broken stream ends with a `data:` chunk holding the error."""

    def _broken(self) -> bytes:
        error = self.dialect.error(502, f"{self.dialect.name} upstream broke off the stream")
        return b"data: " + dumps(error) + b"\n\n"
