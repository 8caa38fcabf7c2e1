"""Validation of Anthropic Messages input: roles, content blocks, tool pairing, tool specs.

Strict where Anthropic itself is strict (only `role` and `content` on a message, tool results
first in their user turn and answering the assistant turn right before), lenient where real
clients are (a tool call left unanswered). Every fault is an `InvalidTranscript` naming the
index of the Anthropic message.
"""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidTranscript

# Blocks with no OpenAI twin: carried through as content parts of their own type. Besides
# the ones checked below, every block type of the Messages API (and its betas) as of the SDK
# 2.x: the results of server tools sit in the assistant turn beside their server_tool_use.
_SERVER_RESULTS = frozenset(
    {
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "advisor_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "mcp_tool_listing",
    }
)
OPAQUE_BLOCKS = (
    frozenset(
        {
            "image",
            "document",
            "search_result",
            "thinking",
            "redacted_thinking",
            "server_tool_use",
            "container_upload",
            "compaction",
            "fallback",
            "tool_addition",
            "tool_removal",
            "tool_reference",  # these two only inside a tool_result's content
            "browser_state",
        }
    )
    | _SERVER_RESULTS
)
_ASSISTANT_ONLY = frozenset(
    {"tool_use", "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"}
)
_USER_ONLY = frozenset({"tool_result"})
_RESULT_CONTENT = frozenset(
    {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
)
_REQUIRED: dict[str, tuple[tuple[str, type], ...]] = {
    "text": (("text", str),),
    "image": (("source", dict),),
    "document": (("source", dict),),
    "thinking": (("thinking", str),),
    "redacted_thinking": (("data", str),),
    "tool_use": (("id", str), ("name", str), ("input", dict)),
    "tool_result": (("tool_use_id", str),),
}
KNOWN_BLOCKS = frozenset({"text", "tool_use", "tool_result"}) | OPAQUE_BLOCKS


def check_system(system: Any) -> None:
    """`system` is None, a string, or a list of text blocks."""
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise InvalidTranscript(
            f"system must be a string or a list of text blocks, got {_kind(system)}"
        )
    for k, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidTranscript(f"system block {k} must be a text block")
        _check_fields(block, f"system block {k}", None)


def validate_message(m: Any, i: int, pending: set[str] | None) -> None:
    """Check Anthropic message `i`; `pending` holds the tool_use ids it may answer."""
    if not isinstance(m, dict):
        raise InvalidTranscript(f"message must be an object, got {_kind(m)}", i)
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        raise InvalidTranscript(f"role must be 'user', 'assistant' or 'system', got {role!r}", i)
    extra = sorted(set(m) - {"role", "content"})
    if extra:
        raise InvalidTranscript(f"unknown message keys {extra} (only 'role' and 'content')", i)
    content = m.get("content")
    if role == "system":  # a system message among the messages: text only, as `system`
        try:
            check_system(content)
        except InvalidTranscript as exc:
            raise InvalidTranscript(exc.reason, i) from None
        if content is None:
            raise InvalidTranscript("a system message needs 'content'", i)
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidTranscript(
            f"'content' must be a string or a list of blocks, got {_kind(content)}", i
        )
    for k, block in enumerate(content):
        _check_block(block, role, i, f"block {k}")
    if role == "assistant":
        _check_unique_ids(content, i)
    else:
        _check_results(content, i, pending)


def user_blocks(content: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split a (validated) user turn into its leading tool results and the blocks after them."""
    n = 0
    while n < len(content) and content[n]["type"] == "tool_result":
        n += 1
    return content[:n], content[n:]


def check_tool_spec(tool: Any, k: int) -> None:
    """An Anthropic tool definition: `name`, optional `description`, object `input_schema`."""
    if not isinstance(tool, dict):
        raise InvalidTranscript(f"tool {k} must be an object, got {_kind(tool)}")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InvalidTranscript(f"tool {k} needs a non-empty string 'name'")
    if "description" in tool and not isinstance(tool["description"], str):
        raise InvalidTranscript(f"tool {k}: 'description' must be a string")
    if not isinstance(tool.get("input_schema"), dict):
        raise InvalidTranscript(f"tool {k} needs an object 'input_schema'")


def _check_block(block: Any, role: str, i: int, where: str) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidTranscript(f"{where} must be an object with a string 'type'", i)
    kind = block["type"]
    if kind not in KNOWN_BLOCKS:
        raise InvalidTranscript(f"{where}: unknown block type {kind!r}", i)
    if (kind in _ASSISTANT_ONLY and role != "assistant") or (kind in _USER_ONLY and role != "user"):
        raise InvalidTranscript(f"{where}: a {kind} block cannot be in a {role} message", i)
    _check_fields(block, where, i)
    if kind == "tool_result":
        _check_result_body(block, i, where)


def _check_fields(block: dict[str, Any], where: str, i: int | None) -> None:
    for name, kind in _REQUIRED.get(block["type"], ()):
        if not isinstance(block.get(name), kind):
            raise InvalidTranscript(
                f"{where}: a {block['type']} block needs {kind.__name__} {name!r}", i
            )
    if block["type"] in ("tool_use", "tool_result"):
        key = "id" if block["type"] == "tool_use" else "tool_use_id"
        if not block[key]:
            raise InvalidTranscript(f"{where}: {key!r} must not be empty", i)


def _check_result_body(block: dict[str, Any], i: int, where: str) -> None:
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise InvalidTranscript(f"{where}: 'is_error' must be a boolean", i)
    content = block.get("content", "")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidTranscript(f"{where}: tool_result content must be a string or blocks", i)
    for k, inner in enumerate(content):
        inner_where = f"{where}, content block {k}"
        if not isinstance(inner, dict) or inner.get("type") not in _RESULT_CONTENT:
            raise InvalidTranscript(
                f"{inner_where}: must be one of {', '.join(sorted(_RESULT_CONTENT))}", i
            )
        _check_fields(inner, inner_where, i)


def _check_unique_ids(content: list[dict[str, Any]], i: int) -> None:
    ids = [b["id"] for b in content if b["type"] == "tool_use"]
    if len(ids) != len(set(ids)):
        raise InvalidTranscript("duplicate tool_use id in one assistant message", i)


def _check_results(content: list[dict[str, Any]], i: int, pending: set[str] | None) -> None:
    results, rest = user_blocks(content)
    if any(b["type"] == "tool_result" for b in rest):
        raise InvalidTranscript("tool_result blocks must come before any other block", i)
    for block in results:
        if pending is None:
            raise InvalidTranscript(
                "tool_result does not follow an assistant message with tool_use", i
            )
        if block["tool_use_id"] not in pending:
            raise InvalidTranscript(
                f"tool_result {block['tool_use_id']!r} answers no tool_use of the previous message",
                i,
            )


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
