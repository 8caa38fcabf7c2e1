"""Windows learned from the provider, for models with none configured.

A model missing from `PREFIT_MODELS` is forwarded unfitted. When the provider refuses such
a request with a context-length error that states its maximum, that maximum is the model's
window: the request is fitted to it and retried, and the tenant's later requests for that
model (in this API process) are fitted to it from the start. Learned windows are kept per
tenant and per app, so one tenant's requests never change how another's are sent. The
reply's share is what the error counted for the completion when it says, else the
configured `reserve_output`, at most a quarter of the window. A configured window always
wins: this is only for models left out.
"""

from __future__ import annotations

import threading

from api.policies import Window
from api.proxy.overflow import Overflow

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
