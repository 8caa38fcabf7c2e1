"""Model windows and the policy the API runs with: never a summarizer, so never an LLM call.

A model's window comes from `PREFIT_MODELS` (`Settings.models`) or from the request's
`max_input_tokens`; a model with neither is an `UnknownModel`. The app keeps one policy per
window (`Policies`), so what a policy remembers of a conversation it prepared (the
transcript it validated and the ledger of its sizes, shared/cut.py) serves the next
prepare of that conversation: then only the new messages are validated and measured. Each
request measures with a copy of it holding the tenant's counter, its calibration ratio read
once for that request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from shared.counting.protocol import TokenCounter
from shared.errors import ConfigError, UnknownModel
from shared.policy import ContextPolicy
from shared.service.jobs import SummaryJob
from shared.service.windows import service_policy
from shared.settings import Settings


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


MAX_WINDOWS = 16  # requests may name any max_input_tokens: keep the latest few
# Conversations each window's policy remembers. Its copies share their strings with the
# messages of the conversation cache (api/cache.py): fewer than the cache holds, they add
# dict containers, not text.
REMEMBERED = 256


class Policies:
    """The app's policies, one per (window, reserve), each remembering the conversations it
    prepared; `get` hands out a copy measuring with the request's counter."""

    def __init__(self, settings: Settings, *, max_windows: int = MAX_WINDOWS) -> None:
        self._settings = settings
        self._max = max_windows
        self._kept: OrderedDict[tuple[int, int], ContextPolicy] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, window: Window, counter: TokenCounter) -> ContextPolicy:
        key = (window.max_input_tokens, window.reserve_output)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                kept = self._kept[key] = service_policy(
                    self._settings, *key, counter, remembered=REMEMBERED
                )
                while len(self._kept) > self._max:
                    self._kept.popitem(last=False)
            self._kept.move_to_end(key)
        return kept.recounted(counter)
