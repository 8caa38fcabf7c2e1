"""The service's policy for one model window, built the same way by the API and the workers."""

from __future__ import annotations

from shared.counting.protocol import TokenCounter
from shared.policy import ContextPolicy
from shared.settings import Settings


def service_policy(
    settings: Settings,
    max_input_tokens: int,
    reserve_output: int,
    counter: TokenCounter,
    *,
    remembered: int = 64,
) -> ContextPolicy:
    """The settings' thresholds for one window, and no summarizer.

    The API (which must never wait on a model) and the workers (which plan what the API
    will need) must measure the same effective tokens, so neither builds its own.
    `remembered`: how many conversations the policy remembers validated and measured.
    """
    return ContextPolicy(
        max_input_tokens,
        reserve_output=reserve_output,
        trigger=settings.trigger,
        target=settings.target,
        keep_recent=settings.keep_recent,
        counter=counter,
        precompute_at=settings.precompute_at,
        keep_tokens_ratio=settings.keep_tokens_ratio,
        chunk_tokens=settings.chunk_tokens,
        max_summary_tokens=settings.max_summary_tokens,
        index_share=settings.index_share,
        remembered=remembered,
    )
