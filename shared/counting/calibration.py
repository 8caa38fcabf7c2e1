"""Calibration: scale an estimate by the ratio actual / estimated seen on real responses.

The ratio is kept per model, exponentially smoothed and clamped, in a `RatioStore`. The
library's rule, which `MemoryRatios` applies (see `smoothed`):

    r   = clamp(observed, lo, hi)
    new = r                                     for the first observation of a model
    new = clamp((1 - smoothing) * prev + smoothing * r, lo, hi)    afterwards

A model of None is stored under `NO_MODEL` (""). The service's Redis store implements the
same protocol with the stricter `SettlingRule` below, in one atomic update per observation.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.counting.counters import HeuristicCounter
from shared.counting.protocol import MessageCounter, TokenCounter, per_message
from shared.errors import ConfigError, ImplausibleObservation
from shared.logs import get_logger
from shared.messages import Message, ToolSpec

log = get_logger(__name__)

NO_MODEL = ""
BOUNDS = (0.4, 3.0)  # the ratios a calibration ever holds: min, max


class RatioStore(Protocol):
    """Where per-model calibration ratios live; `update` must be atomic per model."""

    def get(self, model: str) -> float | None:
        """The model's current ratio, None if it was never observed."""
        ...

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        """Fold one observed ratio into the model's ratio (see `smoothed`); return the new one.

        `smoothing` and `bounds` are the calibrating counter's; the service's Redis store
        folds by its own `SettlingRule` instead.
        """
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
    """An in-process `RatioStore`, thread-safe, holding at most `max_models` models.

    - max_models: how many models' ratios it holds (4096, >= 1); past it, the least recently
      updated model is forgotten.
    """

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

    - base: the counter it scales (None: `HeuristicCounter()`); one with only `count()` gets
      per-message sizes derived from it;
    - smoothing: the weight of each new observation in a model's average (0.3, in (0, 1]);
    - bounds: (lo, hi), the ratios it ever uses: a ratio observed or read is clamped into
      them ((0.4, 3.0); 0 < lo <= 1 <= hi);
    - ratios: where the per-model ratios live (None: `MemoryRatios()`, this process only).
      The service's Redis store (`RedisRatios.of(tenant)`) shares a tenant's ratios between
      processes and folds observations by its own `SettlingRule`, not by `smoothing`.
    """

    def __init__(
        self,
        base: TokenCounter | None = None,
        *,
        smoothing: float = 0.3,
        bounds: tuple[float, float] = BOUNDS,
        ratios: RatioStore | None = None,
    ) -> None:
        if base is None:
            base = HeuristicCounter()
        if not finite(smoothing) or not 0 < smoothing <= 1:
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

        - model: the model whose ratio it updates (None: the ratio of requests with no model);
        - estimated: the uncalibrated estimate (`base.count`) of exactly what was sent;
        - actual: the provider's own prompt-token count for it.

        Both counts must be positive integers (`ConfigError` otherwise).
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


def finite(value: object) -> bool:
    """`value` is a real number (a bool is not), neither infinite nor NaN."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    if (
        not isinstance(bounds, tuple | list)
        or len(bounds) != 2
        or not all(finite(b) for b in bounds)
        or not 0 < bounds[0] <= 1.0 <= bounds[1]
    ):
        raise ConfigError(f"bounds must be (lo, hi) with 0 < lo <= 1 <= hi, got {bounds!r}")
    return float(bounds[0]), float(bounds[1])


# The service's rule: a tenant's ratio settles, and implausible reports are refused.
#
# The library's `CalibratedCounter` folds every observation in (EMA 0.3, clamped to
# (0.4, 3.0)): right for one program observing its own calls. The service takes observations
# from every client of a tenant over HTTP and cannot vouch for each one, so it applies this
# stricter rule instead (in Lua, shared/store/calibration.py, on the same parameters; `fold` is
# the reference the Lua is tested against). With n observations accepted so far:
#
# - an observed ratio (provider's prompt tokens / our estimate) outside `bounds` is refused;
# - once `settle_after` observations are in, one more than `tolerance` times away from the
#   current ratio (above ratio x tolerance or below ratio / tolerance) is refused;
# - an accepted one moves the ratio by the weight 1 / (min(n, settle_after) + 1): the mean of
#   the first observations, then an exponential average with the weight 1 / (settle_after + 1).
#
# So k wrong reports that each pass the check (at most `tolerance` away) move a settled ratio
# by at most about k x (tolerance - 1) / (settle_after + 1): 5 reports 1.5x off move it 2.5%
# with the defaults, and 5 reports 5x off are all refused. A refused observation changes
# nothing and its caller is told why (`ImplausibleObservation`).

SETTLE_AFTER = 100
TOLERANCE = 1.5


@dataclass(frozen=True)
class SettlingRule:
    """Which observed ratios are accepted, and how much each one weighs (see the module)."""

    bounds: tuple[float, float] = BOUNDS
    settle_after: int = SETTLE_AFTER
    tolerance: float = TOLERANCE

    def __post_init__(self) -> None:
        low, high = self.bounds
        if not (finite(low) and finite(high)) or not 0 < low <= 1.0 <= high:
            raise ConfigError(f"bounds must satisfy 0 < low <= 1 <= high, got {self.bounds!r}")
        if isinstance(self.settle_after, bool) or not isinstance(self.settle_after, int):
            raise ConfigError(f"settle_after must be an integer, got {self.settle_after!r}")
        if self.settle_after < 1:
            raise ConfigError(f"settle_after must be >= 1, got {self.settle_after}")
        if not finite(self.tolerance) or self.tolerance <= 1.0:
            raise ConfigError(f"tolerance must be a number > 1, got {self.tolerance!r}")

    def weight(self, observations: int) -> float:
        """The weight of the next observation after `observations` accepted ones."""
        return 1 / (min(observations, self.settle_after) + 1)

    def refusal(self, current: float | None, observations: int, observed: float) -> str | None:
        """Why `observed` is refused (None: accepted), given the current ratio and count."""
        if not finite(observed) or observed <= 0:
            return f"observed ratio {observed!r} is not a positive number"
        low, high = self.bounds
        if not low <= observed <= high:
            return f"observed ratio {observed:.3f} is outside the accepted bounds [{low}, {high}]"
        if current is None or observations < self.settle_after:
            return None
        if not current / self.tolerance <= observed <= current * self.tolerance:
            return (
                f"observed ratio {observed:.3f} is more than {self.tolerance}x away from the "
                f"settled ratio {current:.3f} ({observations} observations)"
            )
        return None

    def fold(self, current: float | None, observations: int, observed: float) -> float:
        """The ratio after accepting `observed`; `ImplausibleObservation` if it is refused."""
        reason = self.refusal(current, observations, observed)
        if reason is not None:
            raise ImplausibleObservation(reason)
        if current is None:
            return float(observed)
        return current + self.weight(observations) * (observed - current)
