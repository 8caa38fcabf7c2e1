"""Room for the reply the client asks for.

Both providers refuse a request whose prompt plus the reply it allows (`max_tokens`, or
OpenAI's `max_completion_tokens`) exceeds the model's context window: "input length and
`max_tokens` exceed context limit" (Anthropic), "you requested N tokens (P in the messages,
C in the completion)" (OpenAI). A window's `reserve_output` is a deployment-wide guess of
that reply; a request that asks for more is fitted with its own figure instead, so it does
not overflow and cost a retry on every turn near the window. A request asking for less keeps
the configured reserve (the budget summaries were planned for); one asking for the whole
window or more cannot be helped by fitting and keeps it too (the provider judges it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from api.policies import Window

# OpenAI's current and legacy names; Anthropic's (which includes a thinking budget)
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")  # + Responses


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The reply size `body` asks for, if it names a positive integer one."""
    for name in OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def with_reply_room(window: Window, body: Mapping[str, Any]) -> Window:
    """`window` with room for the reply `body` asks for, when that is more than its reserve."""
    asked = requested_output(body)
    if asked is None or asked <= window.reserve_output or asked >= window.max_input_tokens:
        return window
    return dataclasses.replace(window, reserve_output=asked)
