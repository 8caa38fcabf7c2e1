"""Model windows and the policy the API runs with: never a summarizer, so never an LLM call.

A model's window comes from `PREFIT_MODELS` (`Settings.models`) or from the request's
`max_input_tokens`; a model with neither is an `UnknownModel`. The policy is built per
request with a counter whose calibration ratio was read once for that request.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.counters import TokenCounter
from shared.errors import ConfigError, UnknownModel
from shared.jobs import SummaryJob
from shared.policy import ContextPolicy
from shared.settings import Settings
from shared.windows import service_policy


@dataclass(frozen=True)
class Window:
    """A model's input window and the part of it kept for the reply."""

    model: str
    max_input_tokens: int
    reserve_output: int

    def job(
        self, tenant: str, conv_id: str, length: int, last_hash: str, extra_tokens: int
    ) -> SummaryJob:
        """The summary job for a conversation of `length` messages measured in this window."""
        return SummaryJob(
            tenant,
            conv_id,
            self.model,
            self.max_input_tokens,
            self.reserve_output,
            length,
            last_hash,
            extra_tokens=extra_tokens,
        )


def resolve_window(settings: Settings, model: str, max_input_tokens: int | None) -> Window:
    """The window for `model`: the request's `max_input_tokens`, else the configured one."""
    configured = settings.models.get(model)
    reserve = settings.reserve_output
    if configured is not None and configured.reserve_output is not None:
        reserve = configured.reserve_output
    if max_input_tokens is not None:
        window = max_input_tokens
    elif configured is not None:
        window = configured.max_input_tokens
    else:
        raise UnknownModel(
            f"no input window is configured for model {model!r}: add it to PREFIT_MODELS "
            "or pass max_input_tokens"
        )
    if window <= reserve:
        raise ConfigError(
            f"max_input_tokens ({window}) of model {model!r} must exceed reserve_output ({reserve})"
        )
    return Window(model, window, reserve)


def make_policy(
    settings: Settings,
    window: Window,
    counter: TokenCounter,
) -> ContextPolicy:
    """The API's policy for one request: settings' thresholds, no summarizer."""
    return service_policy(settings, window.max_input_tokens, window.reserve_output, counter)
