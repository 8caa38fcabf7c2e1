"""The provider protocols the proxy speaks, and what differs between them: `Dialect`.

prefit works on OpenAI-format messages; a dialect turns a request body into those and back,
says how the upstream is authenticated, where the provider's prompt count is, what an
overflow looks like, and how prefit's own errors are shaped so the SDK raises its usual
exception types. One module per dialect: `openai` (Chat Completions), `anthropic`
(Messages), `responses` (OpenAI Responses). The protocol is defined here, in a module that
imports no dialect, so the dialects and the relay (which the Responses dialect extends) all
import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from api.proxy.overflow import Overflow
from api.proxy.streaming import Tap
from shared.messages import Message, ToolSpec


class Dialect(Protocol):
    """One provider protocol (api/proxy/dialects/openai.py, anthropic.py, responses.py)."""

    name: str  # the upstream's name
    forwarded: tuple[str, ...]  # client headers passed on as they are

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

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        """The context-length error in an error answer, with its figures; None otherwise."""
        ...

    def error(self, status: int, message: str) -> dict[str, Any]:
        """An error body of this protocol, for prefit's own errors on its routes."""
        ...


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
