"""Calibration ratios for the API: the shared Redis ratios, read at most once a second.

Every request counts with one ratio read for it (`ScaledCounter`); reading Redis for it on
every request would add a round trip to each prepare, so reads are cached for `ttl`
seconds (a ratio moves slowly: it is a smoothed average over many observations). Updates go
straight to Redis. When Redis is down a stateless prepare may fall back on the last ratio
seen (`last_known`) and say it is degraded; nothing else ever counts with a guess.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from shared.counters import NO_MODEL, RatioStore

TTL_S = 1.0
MAX_MODELS = 4096


class CachedRatios:
    """A `RatioStore` caching another one's reads for `ttl` seconds."""

    def __init__(
        self, inner: RatioStore, *, ttl: float = TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._inner = inner
        self._ttl = ttl
        self._clock = clock
        self._seen: OrderedDict[str, tuple[float | None, float]] = OrderedDict()
        self._lock = threading.Lock()

    def fresh(self, model: str | None) -> bool:
        """True if a read of `model` would be answered from the cache."""
        found = self._seen.get(model or NO_MODEL)
        return found is not None and self._clock() - found[1] < self._ttl

    def get(self, model: str) -> float | None:
        key = model or NO_MODEL
        found = self._seen.get(key)
        if found is not None and self._clock() - found[1] < self._ttl:
            return found[0]
        value = self._inner.get(key)  # StoreUnavailable propagates
        self._remember(key, value)
        return value

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        value = self._inner.update(model or NO_MODEL, observed_ratio, smoothing, bounds)
        self._remember(model or NO_MODEL, value)
        return value

    def last_known(self, model: str | None) -> float | None:
        """The last ratio read for `model`, however old (for degraded answers only)."""
        found = self._seen.get(model or NO_MODEL)
        return found[0] if found is not None else None

    def _remember(self, key: str, value: float | None) -> None:
        with self._lock:
            self._seen.pop(key, None)
            self._seen[key] = (value, self._clock())
            while len(self._seen) > MAX_MODELS:
                self._seen.popitem(last=False)
