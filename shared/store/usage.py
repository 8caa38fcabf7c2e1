"""What each tenant's summaries cost: tokens in and out, dollars, and how many were made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import ConfigError
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, text

# KEYS: usage hash. ARGV: input tokens, output tokens, cost, summaries. `UsageStore.add` as one
# script, for pipelines that cannot hold a MULTI (`shared.store.claims`).
ADD = """
redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[1], 'cost', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'summaries', ARGV[4])
return 1
"""


@dataclass(frozen=True)
class Usage:
    """Running totals for one tenant (never reset by the store)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    summaries: int = 0


class UsageStore:
    """Per-tenant counters, incremented atomically (HINCRBY in a MULTI)."""

    def __init__(self, client: Client) -> None:
        self._r = client

    @guarded
    def add(
        self, tenant: str, input_tokens: int, output_tokens: int, cost: float, *, summaries: int = 1
    ) -> None:
        """Count one summarizer call (or `summaries` of them) against the tenant."""
        _check(input_tokens, output_tokens, cost, summaries)
        key = keys.usage(tenant)
        pipe = self._r.pipeline(transaction=True)
        pipe.hincrby(key, "input_tokens", input_tokens)
        pipe.hincrby(key, "output_tokens", output_tokens)
        pipe.hincrbyfloat(key, "cost", float(cost))
        pipe.hincrby(key, "summaries", summaries)
        pipe.execute()

    @guarded_read
    def get(self, tenant: str) -> Usage:
        """The tenant's totals (all zero before its first summary)."""
        raw = {text(k): text(v) for k, v in self._r.hgetall(keys.usage(tenant)).items()}
        return Usage(
            input_tokens=int(raw.get("input_tokens", 0)),
            output_tokens=int(raw.get("output_tokens", 0)),
            cost=float(raw.get("cost", 0.0)),
            summaries=int(raw.get("summaries", 0)),
        )


def usage_args(
    tenant: str, input_tokens: int, output_tokens: int, cost: float, *, summaries: int = 1
) -> tuple[list[str], list[int | str]]:
    """KEYS and ARGV of the `ADD` script (checked as `UsageStore.add` checks them)."""
    _check(input_tokens, output_tokens, cost, summaries)
    return [keys.usage(tenant)], [input_tokens, output_tokens, repr(float(cost)), summaries]


def _check(input_tokens: int, output_tokens: int, cost: float, summaries: int) -> None:
    for name, value in (
        ("input_tokens", input_tokens),
        ("output_tokens", output_tokens),
        ("summaries", summaries),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
        raise ConfigError(f"cost must be a non-negative finite number, got {cost!r}")
