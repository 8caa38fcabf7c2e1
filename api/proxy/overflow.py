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

The reply rule, one for every attempt: prompt + reply <= window. Both providers refuse a
request whose prompt plus the reply it allows (`max_tokens`, OpenAI's `max_completion_tokens`,
the Responses API's `max_output_tokens`; Gemini's `generationConfig.maxOutputTokens` is
reserved and lowered the same way) exceeds the model's context window: "input length
and `max_tokens` exceed context limit: 13995 + 64000 > 16000" (Anthropic), "you requested N
tokens (P in the messages, C in the completion)" (OpenAI). So:

- The fit leaves room for the reply (`with_reply_room`): the window's `reserve_output` (a
  deployment-wide guess of the reply, the budget summaries are planned for), or the reply
  the request asks for when that is larger, up to a quarter of the window (`REPLY_SHARE`:
  a client asking for 64,000 of a 16k window does not get its prompt cut to nothing).
- Beside the fitted prompt (prefit's estimate P), a reply that does not fit the window is
  lowered (`lowered_reply`) to what the window less a margin for the estimate's error
  (`MARGIN`, 2%) leaves, whether the prompt was cut or sent as it came (`unchanged`).
  Anthropic's extended thinking needs `max_tokens > thinking.budget_tokens`: a budget the
  lowered reply does not exceed goes to half the reply (at least 1,024, Anthropic's least).
- Never below the floor (`reply_floor`): 1,024 tokens (`MIN_REPLY`), 2,048 with a thinking
  budget (1,024 of thinking and 1,024 of answer), or what was asked when that is less (it is
  never raised). When the fit leaves less than the floor the proxy fits deeper (the last
  resort: the whole window less the floor, keeping only the last turn if need be); when even
  that leaves less, the request is refused (400, in the provider's shape: "prompt is too
  long ...") and never forwarded to fail.
- A retry after an overflow fits the same way, with every step the first attempt had (the
  last resort included), and never sends a larger reply than the attempt before it.

What each conversation's overflows teach (`Corrections`). An overflow states the provider's
count N of the prompt prefit estimated at E: that conversation's content is N / E times
denser than the estimate (code, JSON, another language than calibration has seen). The
retry uses it; so does the conversation's next turn, from its first attempt: the tenant's
next request of the same conversation is fitted at pressure E / N (less 2%), so it is not
over the window again and does not pay a round trip for it every turn near the window. The
provider's counts of the answers that follow keep the factor current (and drop it once the
estimate is no longer low: calibration caught up). Kept per tenant and conversation in each
API process (the latest 10,000), never across tenants.

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
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from api.policies import Window
from shared.errors import ReplyDoesNotFit

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
MIN_REPLY = 1_024  # the floor: the least reply a request is lowered to
MIN_THINKING = 1_024  # Anthropic's least thinking budget
REPLY_SHARE = 4  # the reply room a request may claim: at most a quarter of the window
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
    return _tokens(_generation(body).get(GEMINI_OUTPUT))


# Gemini's, inside `generationConfig`
GEMINI_OUTPUT = "maxOutputTokens"


def _generation(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Gemini's `generationConfig` of `body` (empty when it has none)."""
    found = body.get("generationConfig")
    return found if isinstance(found, dict) else {}


def with_reply_room(window: Window, body: Mapping[str, Any]) -> Window:
    """`window` with room for the reply `body` asks for, when that is more than its reserve
    (at most a quarter of the window)."""
    asked = requested_output(body)
    if asked is None or asked <= window.reserve_output:
        return window
    room = max(window.reserve_output, min(asked, window.max_input_tokens // REPLY_SHARE))
    return replace(window, reserve_output=room)


def reply_floor(body: Mapping[str, Any]) -> int:
    """The least reply `body` may be lowered to (0 when it asks for none)."""
    asked = requested_output(body) or 0
    floor = MIN_REPLY + (MIN_THINKING if thinking_budget(body) is not None else 0)
    return min(asked, floor)


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
        if (_tokens(_generation(out).get(GEMINI_OUTPUT)) or 0) > self.sent:
            out["generationConfig"] = {**out["generationConfig"], GEMINI_OUTPUT: self.sent}
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


def lowered_reply(body: Mapping[str, Any], sent: int) -> LoweredReply | None:
    """The reply of `body` lowered to `sent` tokens, its thinking budget under it; None when
    it asks for no more than that. The caller keeps `sent` at least `reply_floor(body)`."""
    asked = requested_output(body)
    if asked is None or asked <= sent:
        return None
    budget = thinking_budget(body)
    if budget is None or budget < sent:
        return LoweredReply(asked, sent)
    return LoweredReply(asked, sent, budget, max(MIN_THINKING, sent // 2))


def reply_beside(
    body: Mapping[str, Any], window: Window, prompt: int, cap: int | None = None
) -> LoweredReply | None:
    """The reply rule for a prompt prefit estimates at `prompt` tokens: None when the reply
    `body` asks for (at most `cap`, what an earlier attempt sent) fits beside it in the
    window; else the reply lowered to what the window less `MARGIN` leaves;
    `ReplyDoesNotFit` when that is under the floor (the prompt must be cut deeper, or the
    request refused)."""
    asked = requested_output(body)
    if asked is None:
        return None
    limit = asked if cap is None else min(asked, cap)
    if prompt + limit <= window.max_input_tokens:
        return lowered_reply(body, limit)
    room = usable(window) - prompt
    floor = reply_floor(body)
    if room < floor:
        raise ReplyDoesNotFit(
            tokens=prompt,
            window=window.max_input_tokens,
            floor=floor,
            asked=asked,
            model=window.model,
        )
    return lowered_reply(body, min(room, limit))


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


# --- what a conversation's overflows teach ------------------------------------------------

MAX_CONVERSATIONS = 10_000  # corrections kept per process: the latest conversations'
LEARN_MARGIN = 1.02  # above the density the provider stated: the next turn's new content


class Corrections:
    """How much denser than prefit's estimate each conversation's prompts are, learned from
    the provider's counts (an overflow's, then the answers'), by tenant and conversation."""

    def __init__(self) -> None:
        self._factors: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def pressure(self, tenant: str, conversation: str) -> float:
        """The pressure to fit `tenant`'s `conversation` at from its first attempt (1.0:
        nothing learned)."""
        with self._lock:
            factor = self._factors.get((tenant, conversation))
        return 1.0 if factor is None else max(FLOOR, 1.0 / factor)

    def overflowed(self, tenant: str, conversation: str, provider: int, estimated: int) -> None:
        """An overflow: the provider counted `provider` tokens of a prompt estimated at
        `estimated` (at pressure 1)."""
        self._set(tenant, conversation, provider, estimated)

    def counted(self, tenant: str, conversation: str, provider: int, estimated: int) -> None:
        """An answer's count of a conversation with a correction: the factor follows it."""
        with self._lock:
            if (tenant, conversation) not in self._factors:
                return
        self._set(tenant, conversation, provider, estimated)

    def _set(self, tenant: str, conversation: str, provider: int, estimated: int) -> None:
        if provider <= 0 or estimated <= 0:
            return
        factor = LEARN_MARGIN * provider / estimated
        key = (tenant, conversation)
        with self._lock:
            self._factors.pop(key, None)
            if factor > LEARN_MARGIN:  # the estimate was low: fit the next turn with it
                self._factors[key] = factor
            while len(self._factors) > MAX_CONVERSATIONS:
                self._factors.popitem(last=False)
