"""Room for the reply the client asks for, and the reply lowered when no fit leaves it.

Both providers refuse a request whose prompt plus the reply it allows (`max_tokens`, or
OpenAI's `max_completion_tokens`, or the Responses API's `max_output_tokens`) exceeds the
model's context window: "input length and `max_tokens` exceed context limit" (Anthropic),
"you requested N tokens (P in the messages, C in the completion)" (OpenAI). A window's
`reserve_output` is a deployment-wide guess of that reply; a request that asks for more is
fitted with its own figure instead, so it does not overflow and cost a retry on every turn
near the window. A request asking for less keeps the configured reserve (the budget
summaries were planned for); one asking for the whole window or more cannot be helped by
fitting and keeps it too (the provider judges it).

When even the deepest fit (the head and the last turn) leaves less room than the request
asks for, the reply it may use is lowered to what the window leaves, less a margin for the
estimate's error (`MARGIN`), rather than forwarding a prompt the provider must refuse: never
below `reply_floor` (an eighth of what was asked, at least 1,024 tokens, never more than
asked), since a reply cut shorter than that is of little use to the client. Anthropic's
extended thinking needs `max_tokens > thinking.budget_tokens`: when the lowered reply would
not exceed the budget, the budget is lowered to half the reply (at least 1,024, Anthropic's
minimum); when even that cannot be, nothing is lowered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from api.policies import Window

# OpenAI's current and legacy names; the Responses API's; Anthropic's (which includes a
# thinking budget). A request names one; the first present is the reply it asks for.
OUTPUT_FIELDS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
MIN_REPLY = 1_024  # the smallest reply worth lowering to; also Anthropic's least thinking budget
FLOOR_SHARE = 8  # ... and at least an eighth of the reply asked for
MARGIN = 0.02  # of the window, left unused when lowering: the estimate's error


def _tokens(value: Any) -> int | None:
    """`value` when it is a positive integer (not a bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The reply size `body` asks for, if it names a positive integer one."""
    for name in OUTPUT_FIELDS:
        value = _tokens(body.get(name))
        if value is not None:
            return value
    return None


def with_reply_room(window: Window, body: Mapping[str, Any]) -> Window:
    """`window` with room for the reply `body` asks for, when that is more than its reserve."""
    asked = requested_output(body)
    if asked is None or asked <= window.reserve_output or asked >= window.max_input_tokens:
        return window
    return dataclasses.replace(window, reserve_output=asked)


def reply_floor(asked: int) -> int:
    """The least reply a request asking for `asked` tokens is lowered to."""
    return min(asked, max(MIN_REPLY, asked // FLOOR_SHARE))


def usable(window: Window) -> int:
    """The window less the margin kept when the reply is lowered."""
    return window.max_input_tokens - int(window.max_input_tokens * MARGIN)


@dataclasses.dataclass(frozen=True)
class LoweredReply:
    """The reply a request may use lowered from `asked` to `sent` tokens (and its thinking
    budget from `budget` to `budget_sent`, when it had to go too)."""

    asked: int
    sent: int
    budget: int | None = None
    budget_sent: int | None = None

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` with every reply field over `sent` lowered to it (and the budget)."""
        out = dict(body)
        for name in OUTPUT_FIELDS:
            if (_tokens(out.get(name)) or 0) > self.sent:
                out[name] = self.sent
        if self.budget_sent is not None:
            out["thinking"] = {**out["thinking"], "budget_tokens": self.budget_sent}
        return out

    def headers(self) -> dict[str, str]:
        """`x-prefit-max-tokens` (and `x-prefit-thinking-budget`): `lowered A -> B`."""
        out = {"x-prefit-max-tokens": f"lowered {self.asked} -> {self.sent}"}
        if self.budget_sent is not None:
            out["x-prefit-thinking-budget"] = f"lowered {self.budget} -> {self.budget_sent}"
        return out


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """Anthropic's extended-thinking budget of `body`, when it enables one."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    return _tokens(thinking.get("budget_tokens"))


def lowered_reply(body: Mapping[str, Any], room: int) -> LoweredReply | None:
    """The reply `body` may use when only `room` tokens are left beside its prompt; None
    when it asks for no more than that, or cannot be lowered: `room` is under the floor, or
    leaves no thinking budget Anthropic accepts."""
    asked = requested_output(body)
    if asked is None or asked <= room or room < reply_floor(asked):
        return None
    budget = thinking_budget(body)
    if budget is None or budget < room:
        return LoweredReply(asked, room)
    budget_sent = max(MIN_REPLY, room // 2)
    if budget_sent >= room:
        return None
    return LoweredReply(asked, room, budget, budget_sent)
