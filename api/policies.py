"""Model windows and the policy the API runs with: never a summarizer, so never an LLM call.

A model's window comes from `PREFIT_MODELS` (`Settings.models`) or from the request's
`max_input_tokens`; a model with neither is an `UnknownModel`. The policy is built per
request with a counter whose calibration ratio was read once for that request.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.counters import TokenCounter
from shared.errors import ConfigError, UnknownModel
from shared.policy import ContextPolicy
from shared.settings import Settings


@dataclass(frozen=True)
class Window:
    """A model's input window and the part of it kept for the reply."""

    model: str
    max_input_tokens: int
    reserve_output: int


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
    return ContextPolicy(
        window.max_input_tokens,
        reserve_output=window.reserve_output,
        trigger=settings.trigger,
        target=settings.target,
        keep_recent=settings.keep_recent,
        counter=counter,
        summarizer=None,
        precompute_at=settings.precompute_at,
        keep_tokens_ratio=settings.keep_tokens_ratio,
        chunk_tokens=settings.chunk_tokens,
        max_summary_tokens=settings.max_summary_tokens,
    )
