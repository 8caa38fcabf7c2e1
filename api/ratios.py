"""Calibration ratios for the API: each tenant's Redis ratios, read at most once a second.

Every request counts with one ratio read for it (`ScaledCounter`): the tenant's ratio of the
request's model. Reading Redis for it on every request would add a round trip to each
prepare, so reads are cached for `ttl` seconds per (tenant, model) (a ratio moves slowly: it
settles over many observations). Observations go straight to Redis, where the service's rule
accepts or refuses them (shared/counting/calibration.py). When Redis is down a stateless
prepare may fall back on the last ratio seen (`last_known`) and say it is degraded; nothing
else ever counts with a guess.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from shared.counting.calibration import NO_MODEL

TTL_S = 1.0
MAX_ENTRIES = 4096


class TenantRatioStore(Protocol):
    """Ratios per tenant and model (`shared.store.RedisRatios`)."""

    def get(self, tenant: str, model: str | None) -> float | None: ...

    def observe(self, tenant: str, model: str | None, observed: float) -> float: ...


class CachedRatios:
    """A `TenantRatioStore` caching another one's reads for `ttl` seconds."""

    def __init__(
        self,
        inner: TenantRatioStore,
        *,
        ttl: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._ttl = ttl
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], tuple[float | None, float]] = OrderedDict()
        self._lock = threading.Lock()

    def fresh(self, tenant: str, model: str | None) -> bool:
        """True if a read of the tenant's `model` would be answered from the cache."""
        found = self._seen.get((tenant, model or NO_MODEL))
        return found is not None and self._clock() - found[1] < self._ttl

    def get(self, tenant: str, model: str | None) -> float | None:
        key = (tenant, model or NO_MODEL)
        found = self._seen.get(key)
        if found is not None and self._clock() - found[1] < self._ttl:
            return found[0]
        value = self._inner.get(tenant, key[1])  # StoreUnavailable propagates
        self._remember(key, value)
        return value

    def observe(self, tenant: str, model: str | None, observed: float) -> float:
        value = self._inner.observe(tenant, model or NO_MODEL, observed)
        self._remember((tenant, model or NO_MODEL), value)
        return value

    def last_known(self, tenant: str, model: str | None) -> float | None:
        """The last ratio read for the tenant's `model`, however old (degraded answers only)."""
        found = self._seen.get((tenant, model or NO_MODEL))
        return found[0] if found is not None else None

    def _remember(self, key: tuple[str, str], value: float | None) -> None:
        with self._lock:
            self._seen.pop(key, None)
            self._seen[key] = (value, self._clock())
            while len(self._seen) > MAX_ENTRIES:
                self._seen.popitem(last=False)
