"""Calibration: scale an estimate by the ratio actual / estimated seen on real responses.

The ratio is kept per model, exponentially smoothed and clamped, in a `RatioStore` (in
memory here; the Redis store implements the same protocol with an atomic update). The
update rule, which every store must apply exactly (see `smoothed`):

    r   = clamp(observed, lo, hi)
    new = r                                     for the first observation of a model
    new = clamp((1 - smoothing) * prev + smoothing * r, lo, hi)    afterwards

A model of None is stored under `NO_MODEL` ("").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.counters import HeuristicCounter
from shared.counting import MessageCounter, TokenCounter, per_message
from shared.errors import ConfigError
from shared.logs import get_logger
from shared.messages import Message, ToolSpec

log = get_logger(__name__)

NO_MODEL = ""


class RatioStore(Protocol):
    """Where per-model calibration ratios live; `update` must be atomic per model."""

    def get(self, model: str) -> float | None:
        """The model's current ratio, None if it was never observed."""
        ...

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        """Fold one observed ratio into the model's ratio (see `smoothed`); return the new one."""
        ...


def smoothed(
    prev: float | None, observed: float, smoothing: float, bounds: tuple[float, float]
) -> float:
    """The calibration update rule shared by every `RatioStore`."""
    lo, hi = bounds
    ratio = min(max(observed, lo), hi)
    if prev is not None:
        ratio = min(max((1 - smoothing) * prev + smoothing * ratio, lo), hi)
    return ratio


class MemoryRatios:
    """An in-process `RatioStore`, thread-safe, holding at most `max_models` models."""

    def __init__(self, max_models: int = 4096) -> None:
        if isinstance(max_models, bool) or not isinstance(max_models, int) or max_models < 1:
            raise ConfigError(f"max_models must be an integer >= 1, got {max_models!r}")
        self.max_models = max_models
        self._ratios: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, model: str) -> float | None:
        return self._ratios.get(model)

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        with self._lock:
            new = smoothed(self._ratios.pop(model, None), observed_ratio, smoothing, bounds)
            if len(self._ratios) >= self.max_models:  # forget the least recently updated model
                del self._ratios[next(iter(self._ratios))]
            self._ratios[model] = new
        return new


@dataclass(frozen=True)
class ScaledCounter:
    """A counter times a fixed ratio (rounded up): one model's calibration, read once."""

    base: MessageCounter
    ratio: float

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        return scale(self.ratio, self.base.count(messages, tools, model))

    def count_message(self, message: Message, model: str | None = None) -> int:
        return scale(self.ratio, self.base.count_message(message, model))

    def count_tools(self, tools: Sequence[ToolSpec], model: str | None = None) -> int:
        return scale(self.ratio, self.base.count_tools(tools, model))


class CalibratedCounter:
    """Wraps a counter and scales it by the smoothed, per-model ratio actual / estimated.

    Each `count*` call reads the model's ratio once; a caller making many counts for one
    request (a `prepare`) should take `scaled(model)` once and count with that, so a slow
    (networked) `RatioStore` is read once per request. A store error propagates: silently
    counting with ratio 1.0 could under-count and overflow the window.
    """

    def __init__(
        self,
        base: TokenCounter | None = None,
        *,
        smoothing: float = 0.3,
        bounds: tuple[float, float] = (0.4, 3.0),
        ratios: RatioStore | None = None,
    ) -> None:
        if base is None:
            base = HeuristicCounter()
        if not _real(smoothing) or not 0 < smoothing <= 1:
            raise ConfigError(f"smoothing must be in (0, 1], got {smoothing!r}")
        lo, hi = _bounds(bounds)
        self.base: MessageCounter = per_message(base)
        self.smoothing = float(smoothing)
        self.bounds = (lo, hi)
        self.ratios: RatioStore = ratios if ratios is not None else MemoryRatios()

    def __repr__(self) -> str:
        return f"CalibratedCounter({self.base!r}, smoothing={self.smoothing}, bounds={self.bounds})"

    def ratio(self, model: str | None) -> float:
        """The model's current ratio: 1.0 until it is observed."""
        found = self.ratios.get(model or NO_MODEL)
        if found is None:
            return 1.0
        lo, hi = self.bounds
        return min(max(found, lo), hi)  # a shared store may hold a ratio from other bounds

    def scaled(self, model: str | None) -> ScaledCounter:
        """A counter with the model's current ratio fixed (one store read)."""
        return ScaledCounter(self.base, self.ratio(model))

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        return scale(self.ratio(model), self.base.count(messages, tools, model))

    def count_message(self, message: Message, model: str | None = None) -> int:
        return scale(self.ratio(model), self.base.count_message(message, model))

    def count_tools(self, tools: Sequence[ToolSpec], model: str | None = None) -> int:
        return scale(self.ratio(model), self.base.count_tools(tools, model))

    def observe(self, model: str | None, estimated: int, actual: int) -> float:
        """Feed back one measurement; return the model's new ratio.

        `estimated` must be the uncalibrated estimate (`base.count`) of exactly what was sent,
        `actual` the provider's own prompt-token count; both must be positive integers.
        """
        for name, value in (("estimated", estimated), ("actual", actual)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        new = self.ratios.update(model or NO_MODEL, actual / estimated, self.smoothing, self.bounds)
        log.debug(
            "calibration.observed", model=model, estimated=estimated, actual=actual, ratio=new
        )
        return new


def scale(ratio: float, tokens: int) -> int:
    """`ceil(ratio * tokens)`, without float noise turning an exact product into one more."""
    if ratio == 1.0:
        return tokens
    return math.ceil(ratio * tokens * (1 - 1e-12))


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    if (
        not isinstance(bounds, tuple | list)
        or len(bounds) != 2
        or not all(_real(b) for b in bounds)
        or not 0 < bounds[0] <= 1.0 <= bounds[1]
    ):
        raise ConfigError(f"bounds must be (lo, hi) with 0 < lo <= 1 <= hi, got {bounds!r}")
    return float(bounds[0]), float(bounds[1])
