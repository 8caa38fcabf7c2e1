"""Windows learned from the provider, for models with none configured.

A model missing from `PREFIT_MODELS` is forwarded unfitted. When the provider refuses such
a request with a context-length error that states its maximum, that maximum is the model's
window: the request is fitted to it and retried, and the model's later requests (in this
API process) are fitted to it from the start. The reply's share is what the error counted
for the completion when it says, else the configured `reserve_output`, at most a quarter
of the window. A configured window always wins: this is only for models left out.
"""

from __future__ import annotations

import threading

from api.policies import Window
from api.proxy.overflow import Overflow

MAX_MODELS = 256  # model names are the client's: keep the latest few
MIN_WINDOW = 256  # a stated maximum below this is no window to fit to


class LearnedWindows:
    """The windows providers stated for unconfigured models, by model name."""

    def __init__(self) -> None:
        self._windows: dict[str, Window] = {}
        self._lock = threading.Lock()

    def get(self, model: str) -> Window | None:
        """The window learned for `model`, if any."""
        with self._lock:
            return self._windows.get(model)

    def learn(self, model: str, overflow: Overflow, reserve: int) -> Window | None:
        """The window `overflow` states for `model` (remembered); None if it states none."""
        limit = overflow.limit
        if limit is None or limit < MIN_WINDOW:
            return None
        kept = overflow.output if overflow.output is not None else reserve
        window = Window(model, limit, min(kept, limit // 4))
        with self._lock:
            self._windows.pop(model, None)
            self._windows[model] = window
            while len(self._windows) > MAX_MODELS:
                del self._windows[next(iter(self._windows))]
        return window


LEARNED = LearnedWindows()
