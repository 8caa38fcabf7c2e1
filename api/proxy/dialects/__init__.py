"""The provider protocols the proxy speaks, and what differs between them: `Dialect`.

prefit works on OpenAI-format messages; a dialect turns a request body into those and back,
reads what the request asks (the model, whether streamed, the upstream endpoint: `Asked`,
from the body or the path), owns its provider (where it is and the deployment's key, from
its own `PREFIT_<PROVIDER>_*` settings: `upstream`), says how the upstream is
authenticated, where the provider's prompt count is (in an answer, a stream, a count-tokens
answer), what an overflow looks like (its error patterns live in the dialect's module), and
how prefit's own errors are shaped so the SDK raises its usual exception types. A dialect
is made per app from the settings (api/proxy/services.py). One module per dialect:
`openai` (Chat Completions), `anthropic` (Messages), `responses` (OpenAI Responses). The
protocol is defined here, in a module that imports no dialect, so the dialects and the
relay (which the Responses dialect extends) all import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from api.proxy.overflow import Overflow
from api.proxy.streaming import Tap
from api.proxy.upstream import Upstream
from shared.messages import Message, ToolSpec


@dataclass(frozen=True)
class Asked:
    """What one request asks of its upstream: the model, whether the answer is streamed,
    and the endpoint (path and query under the upstream's root) it goes to."""

    model: str
    stream: bool
    endpoint: str


class Dialect(Protocol):
    """One provider protocol (api/proxy/dialects/openai.py, anthropic.py, responses.py)."""

    name: str  # the upstream's name
    forwarded: tuple[str, ...]  # client headers passed on as they are
    upstream: Upstream  # where its provider is, and the deployment's key for it

    def asked(self, path: str, query: str, body: Mapping[str, Any]) -> Asked:
        """What the request to prefit's `path` (with its `query`) and `body` asks upstream."""
        ...

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        """The request's messages in OpenAI format, validated (by `check` when they come in
        that format: the app's memo of transcripts checked, `ValidatedPrefixes.validate`),
        and its tool specs as sent (for counting); `InvalidTranscript` if the messages
        cannot be read."""
        ...

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        """`body` with its messages (and system) replaced by `messages`; the rest as it was."""
        ...

    def auth(self, key: str) -> dict[str, str]:
        """The header that authenticates the deployment's `key` upstream."""
        ...

    def defaults(self) -> dict[str, str]:
        """Headers every upstream request carries unless the client gave them."""
        ...

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """For a streamed request: the body to send instead (None: as it is), and whether
        the tap must drop what prefit added."""
        ...

    def tap(self, strip: bool) -> Tap:
        """A tap for one streamed answer."""
        ...

    def prompt_tokens(self, answer: Any) -> int | None:
        """The provider's own prompt count in a (non-streamed) answer."""
        ...

    def counted(self, answer: Any) -> int | None:
        """The prompt's tokens in the provider's answer to a count-tokens request."""
        ...

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        """The context-length error in an error answer, with its figures; None otherwise."""
        ...

    def error(self, status: int, message: str) -> dict[str, Any]:
        """An error body of this protocol, for prefit's own errors on its routes."""
        ...


def asked_in_body(path: str, body: Mapping[str, Any]) -> Asked:
    """The call of a protocol that names the model and the stream in the body and whose
    endpoints are prefit's paths under /v1 (OpenAI's and Anthropic's)."""
    return Asked(str(body.get("model")), body.get("stream") is True, path.removeprefix("/v1"))


def tools_of(body: Mapping[str, Any]) -> list[ToolSpec]:
    """The request's tool definitions as sent (for counting)."""
    tools = body.get("tools")
    return list(tools) if isinstance(tools, list) else []


def error_fields(answer: Any) -> tuple[str, str]:
    """(code, message) of a provider's error body (`{"error": {"message", ...}}`, OpenAI's
    with a `code`), empty strings where absent."""
    err = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(err, dict):
        return "", ""
    code, message = err.get("code"), err.get("message")
    return (code if isinstance(code, str) else ""), (message if isinstance(message, str) else "")
