"""Calibration ratios in Redis, shared by every API replica and worker.

A ratio (provider's prompt tokens / our estimate) describes a model's tokenizer, not anyone's
data, so it is global per model (under `prefit:v1:global:`), not per tenant: every tenant's
traffic improves the same estimate. Implements the `RatioStore` protocol of shared/counters.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from shared import keys
from shared.errors import ConfigError
from shared.store.client import guarded, text

# KEYS: ratio hash. ARGV: observed, smoothing, low, high. `shared.calibration.smoothed` in Lua:
# the observation is clamped, the first one sets the ratio, later ones blend in (EMA), and the
# result is clamped. Returned as a string: Lua numbers would come back truncated to integers.
UPDATE = """
local old = tonumber(redis.call('HGET', KEYS[1], 'ratio'))
local smoothing = tonumber(ARGV[2])
local low, high = tonumber(ARGV[3]), tonumber(ARGV[4])
local new = math.min(high, math.max(low, tonumber(ARGV[1])))
if old then new = math.min(high, math.max(low, (1 - smoothing) * old + smoothing * new)) end
local encoded = string.format('%.17g', new)
redis.call('HSET', KEYS[1], 'ratio', encoded)
redis.call('HINCRBY', KEYS[1], 'observations', 1)
return encoded
"""


@dataclass(frozen=True)
class Calibration:
    """A model's current ratio and how many observations shaped it."""

    ratio: float
    observations: int


class RedisRatios:
    """`RatioStore` on Redis: atomic smoothed updates, so concurrent observations all count."""

    def __init__(self, client: redis.Redis) -> None:
        self._r = client
        self._update = client.register_script(UPDATE)

    @guarded
    def get(self, model: str | None) -> float | None:
        """The model's ratio, or None before its first observation."""
        raw = self._r.hget(keys.ratio(model), "ratio")
        return float(text(raw)) if raw is not None else None

    @guarded
    def update(
        self,
        model: str | None,
        observed_ratio: float,
        smoothing: float,
        bounds: tuple[float, float],
    ) -> float:
        """Fold one observation in: new = old x (1 - smoothing) + observed x smoothing, clamped."""
        low, high = _check(observed_ratio, smoothing, bounds)
        args = [repr(float(observed_ratio)), repr(float(smoothing)), repr(low), repr(high)]
        return float(text(self._update(keys=[keys.ratio(model)], args=args)))

    @guarded
    def calibration(self, model: str | None) -> Calibration | None:
        """Ratio and observation count together (for operators and tests)."""
        raw = self._r.hmget(keys.ratio(model), ["ratio", "observations"])
        if raw[0] is None:
            return None
        return Calibration(float(text(raw[0])), int(text(raw[1] or b"0")))


def _check(observed: float, smoothing: float, bounds: tuple[float, float]) -> tuple[float, float]:
    if not _finite(observed) or observed <= 0:
        raise ConfigError(f"observed ratio must be a positive finite number, got {observed!r}")
    if not _finite(smoothing) or not 0 < smoothing <= 1:
        raise ConfigError(f"smoothing must be in (0, 1], got {smoothing!r}")
    low, high = bounds
    if not (_finite(low) and _finite(high)) or not 0 < low <= high:
        raise ConfigError(f"bounds must satisfy 0 < low <= high, got {bounds!r}")
    return float(low), float(high)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
