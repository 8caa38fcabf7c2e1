"""Calibration ratios in Redis, per tenant and model, shared by every API replica and worker.

A ratio (provider's prompt tokens / our estimate) is kept per tenant: observations come from
a tenant's own clients, so what one tenant reports never changes how another tenant's
prompts are counted. Updates follow the service's `SettlingRule`
(shared/counting/calibration.py) in one Lua call: an implausible observation is refused and
changes nothing. A ratio key expires `retention_s` after its last accepted observation (then
the model counts at 1.0 again).

`of(tenant)` is the tenant's `RatioStore` (shared/counting/calibration.py), for a
`CalibratedCounter`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.counting.calibration import RatioStore, SettlingRule, finite
from shared.errors import ImplausibleObservation
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text, ttl_ms

# KEYS: ratio hash. ARGV: observed, low, high, settle after, tolerance, ttl ms.
# `SettlingRule.fold` in Lua (same operations, so the same doubles). Ratios travel as
# strings: Lua numbers would come back truncated to integers.
# Refused: {0, reason ('bounds'|'far'), current ratio or false, observations}.
# Accepted: {1, new ratio, observations}.
UPDATE = """
local raw = redis.call('HMGET', KEYS[1], 'ratio', 'observations')
local old, n = tonumber(raw[1]), tonumber(raw[2] or '0')
local x = tonumber(ARGV[1])
local settle, tolerance = tonumber(ARGV[4]), tonumber(ARGV[5])
if x < tonumber(ARGV[2]) or x > tonumber(ARGV[3]) then return {0, 'bounds', raw[1], n} end
if old and n >= settle and (x < old / tolerance or x > old * tolerance) then
  return {0, 'far', raw[1], n}
end
local new = x
if old then new = old + (1 / (math.min(n, settle) + 1)) * (x - old) end
local encoded = string.format('%.17g', new)
redis.call('HSET', KEYS[1], 'ratio', encoded, 'observations', n + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, encoded, n + 1}
"""


@dataclass(frozen=True)
class Calibration:
    """A model's current ratio and how many observations shaped it."""

    ratio: float
    observations: int


class RedisRatios:
    """Every tenant's calibration ratios: atomic settled updates, so concurrent ones all count."""

    def __init__(
        self, client: Client, *, retention_s: float, rule: SettlingRule | None = None
    ) -> None:
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self.rule = rule if rule is not None else SettlingRule()
        self._update = client.register_script(UPDATE)

    def of(self, tenant: str) -> TenantRatios:
        """The tenant's ratios as a `RatioStore`."""
        keys.check_tenant(tenant)
        return TenantRatios(self, tenant)

    @guarded_read
    def get(self, tenant: str, model: str | None) -> float | None:
        """The tenant's ratio for `model`, or None before its first observation."""
        raw = self._r.hget(keys.ratio(tenant, model), "ratio")
        return float(text(raw)) if raw is not None else None

    @guarded
    def observe(self, tenant: str, model: str | None, observed: float) -> float:
        """Fold one observed ratio in by the rule and return the new ratio; an implausible
        one raises `ImplausibleObservation` and changes nothing."""
        if not finite(observed) or observed <= 0:
            raise ImplausibleObservation(f"observed ratio {observed!r} is not a positive number")
        rule = self.rule
        low, high = rule.bounds
        args: list[str | int] = [repr(float(observed)), repr(low), repr(high)]
        args += [rule.settle_after, repr(rule.tolerance), self._ttl]
        reply = self._update(keys=[keys.ratio(tenant, model)], args=args)
        if not reply[0]:
            current = float(text(reply[2])) if reply[2] else None
            reason = rule.refusal(current, int(reply[3]), float(observed))
            raise ImplausibleObservation(reason or f"observation refused ({text(reply[1])})")
        return float(text(reply[1]))

    @guarded_read
    def calibration(self, tenant: str, model: str | None) -> Calibration | None:
        """Ratio and observation count together (for operators and tests)."""
        raw = self._r.hmget(keys.ratio(tenant, model), ["ratio", "observations"])
        if raw[0] is None:
            return None
        return Calibration(float(text(raw[0])), int(text(raw[1] or b"0")))


@dataclass(frozen=True)
class TenantRatios:
    """One tenant's ratios as a `RatioStore`. `update` applies the service's `SettlingRule`:
    the `smoothing` and `bounds` a `CalibratedCounter` passes are not used, since a tenant's
    ratio settles instead (shared/counting/calibration.py)."""

    ratios: RedisRatios
    tenant: str

    def get(self, model: str) -> float | None:
        return self.ratios.get(self.tenant, model)

    def update(
        self, model: str, observed_ratio: float, smoothing: float, bounds: tuple[float, float]
    ) -> float:
        return self.ratios.observe(self.tenant, model, observed_ratio)


_: type[RatioStore] = TenantRatios  # the protocol is met
