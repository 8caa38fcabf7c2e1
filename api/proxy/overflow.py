"""Overflows of the model's window: avoided (reply room), retried, and learned from.

The overflow rule (`next_pressure`): after a context-length error, prepare again at a lower
pressure. `pressure` in (0, 1] makes prepare treat its estimate as 1/pressure times too
small. When the provider's error states its figures (its count of the prompt we sent and its
maximum), the pressure is derived from them: our estimate E of that prompt stood for N
provider tokens, so a prompt the provider accepts (at most `allowed` of its tokens) is one
our estimate puts at allowed x E / N, and prepare fits under pressure x budget. A safety
margin covers the estimate's own noise. Without figures the pressure drops by a fixed step.
It always drops, so each retry sends a smaller prompt; the proxy retries at most
`MAX_RETRIES`. What an overflow looks like, and the figures of its message, are each
provider's: its dialect reads them (api/proxy/dialects/, `Dialect.overflow`).

Room for the reply the client asks for (`with_reply_room`), and the reply lowered when no
fit leaves it (`lowered_reply`). Both providers refuse a request whose prompt plus the reply
it allows (`max_tokens`, or OpenAI's `max_completion_tokens`, or the Responses API's
`max_output_tokens`) exceeds the model's context window: "input length and `max_tokens`
exceed context limit" (Anthropic), "you requested N tokens (P in the messages, C in the
completion)" (OpenAI). A window's `reserve_output` is a deployment-wide guess of that reply;
a request that asks for more is fitted with its own figure instead, so it does not overflow
and cost a retry on every turn near the window. A request asking for less keeps the
configured reserve (the budget summaries were planned for); one asking for the whole window
or more cannot be helped by fitting and keeps it too (the provider judges it).

When even the deepest fit (the head and the last turn) leaves less room than the request
asks for, the reply it may use is lowered to what the window leaves, less a margin for the
estimate's error (`MARGIN`), rather than forwarding a prompt the provider must refuse: never
below `reply_floor` (an eighth of what was asked, at least 1,024 tokens, never more than
asked), since a reply cut shorter than that is of little use to the client. Anthropic's
extended thinking needs `max_tokens > thinking.budget_tokens`: when the lowered reply would
not exceed the budget, the budget is lowered to half the reply (at least 1,024, Anthropic's
minimum); when even that cannot be, nothing is lowered.

Windows learned from the provider (`LearnedWindows`), for models with none configured. A
model missing from `PREFIT_MODELS` is forwarded unfitted. When the provider refuses such a
request with a context-length error that states its maximum, that maximum is the model's
window: the request is fitted to it and retried, and the tenant's later requests for that
model (in this API process) are fitted to it from the start. Learned windows are kept per
tenant and per app, so one tenant's requests never change how another's are sent. The
reply's share is what the error counted for the completion when it says, else the configured
`reserve_output`, at most a quarter of the window. A configured window always wins: this is
only for models left out.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from api.policies import Window

# --- the overflow rule --------------------------------------------------------------------

MAX_RETRIES = 2
SAFETY = 0.9  # aim under what the figures allow
STEP = 0.7  # pressure x STEP when the error states no figures
SHRINK = 0.9  # a retry's pressure is at most this much of the last one
FLOOR = 0.05

# a figure in an overflow's message ("128000", "1,048,576"): each dialect's patterns use it
NUMBER = r"(\d[\d,]*)"


@dataclass(frozen=True)
class Overflow:
    """A context-length error's figures, each None when the error does not state it."""

    prompt_tokens: int | None = None  # the provider's count of the prompt sent
    limit: int | None = None  # its maximum context
    output: int | None = None  # what it counted for the answer, when it says


def number(text: str | None) -> int | None:
    """The figure `NUMBER` matched (None for no match)."""
    return int(text.replace(",", "")) if text else None


def next_pressure(
    current: float, overflow: Overflow, *, estimated: int, budget: int, reserve: int
) -> float:
    """The pressure of the retry after `overflow`, for a prompt we had estimated at
    `estimated` tokens (at pressure 1) in a window whose budget is `budget`."""
    ceiling = current * SHRINK
    stepped = max(FLOOR, current * STEP)
    n, limit = overflow.prompt_tokens, overflow.limit
    if not n or not limit or estimated <= 0 or budget <= 0:
        return stepped
    allowed = limit - (overflow.output if overflow.output is not None else reserve)
    if allowed <= 0:
        return stepped
    wanted = SAFETY * allowed * estimated / (n * budget)
    return max(FLOOR, min(wanted, ceiling))


# --- room for the reply -------------------------------------------------------------------

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
    return replace(window, reserve_output=asked)


def reply_floor(asked: int) -> int:
    """The least reply a request asking for `asked` tokens is lowered to."""
    return min(asked, max(MIN_REPLY, asked // FLOOR_SHARE))


def usable(window: Window) -> int:
    """The window less the margin kept when the reply is lowered."""
    return window.max_input_tokens - int(window.max_input_tokens * MARGIN)


@dataclass(frozen=True)
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


# --- windows learned from overflows -------------------------------------------------------

MAX_MODELS = 256  # model names are the clients': keep the latest few
MIN_WINDOW = 256  # a stated maximum below this is no window to fit to


class LearnedWindows:
    """The windows providers stated for unconfigured models, by tenant and model name."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], Window] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str, model: str) -> Window | None:
        """The window learned for `tenant`'s `model`, if any."""
        with self._lock:
            return self._windows.get((tenant, model))

    def learn(self, tenant: str, model: str, overflow: Overflow, reserve: int) -> Window | None:
        """The window `overflow` states for `tenant`'s `model` (remembered); None if it
        states none."""
        limit = overflow.limit
        if limit is None or limit < MIN_WINDOW:
            return None
        kept = overflow.output if overflow.output is not None else reserve
        window = Window(model, limit, min(kept, limit // 4))
        with self._lock:
            self._windows.pop((tenant, model), None)
            self._windows[tenant, model] = window
            while len(self._windows) > MAX_MODELS:
                del self._windows[next(iter(self._windows))]
        return window
