"""The service's calibration rule: a tenant's ratio settles, and implausible reports are refused.

The library's `CalibratedCounter` folds every observation in (EMA 0.3, clamped to
(0.4, 3.0)): right for one program observing its own calls. The service takes observations
from every client of a tenant over HTTP and cannot vouch for each one, so it applies this
stricter rule instead (in Lua, shared/store/calibration.py, on the same parameters; `fold` is
the reference the Lua is tested against). With n observations accepted so far:

- an observed ratio (provider's prompt tokens / our estimate) outside `bounds` is refused;
- once `settle_after` observations are in, one more than `tolerance` times away from the
  current ratio (above ratio x tolerance or below ratio / tolerance) is refused;
- an accepted one moves the ratio by the weight 1 / (min(n, settle_after) + 1): the mean of
  the first observations, then an exponential average with the weight 1 / (settle_after + 1).

So k wrong reports that each pass the check (at most `tolerance` away) move a settled ratio
by at most about k x (tolerance - 1) / (settle_after + 1): 5 reports 1.5x off move it 2.5%
with the defaults, and 5 reports 5x off are all refused. A refused observation changes
nothing and its caller is told why (`ImplausibleObservation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import ConfigError, ImplausibleObservation

BOUNDS = (0.4, 3.0)
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
        if not (_finite(low) and _finite(high)) or not 0 < low <= 1.0 <= high:
            raise ConfigError(f"bounds must satisfy 0 < low <= 1 <= high, got {self.bounds!r}")
        if isinstance(self.settle_after, bool) or not isinstance(self.settle_after, int):
            raise ConfigError(f"settle_after must be an integer, got {self.settle_after!r}")
        if self.settle_after < 1:
            raise ConfigError(f"settle_after must be >= 1, got {self.settle_after}")
        if not _finite(self.tolerance) or self.tolerance <= 1.0:
            raise ConfigError(f"tolerance must be a number > 1, got {self.tolerance!r}")

    def weight(self, observations: int) -> float:
        """The weight of the next observation after `observations` accepted ones."""
        return 1 / (min(observations, self.settle_after) + 1)

    def refusal(self, current: float | None, observations: int, observed: float) -> str | None:
        """Why `observed` is refused (None: accepted), given the current ratio and count."""
        if not _finite(observed) or observed <= 0:
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


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
