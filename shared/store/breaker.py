"""A circuit breaker per summarizer configuration, shared by every worker process through Redis.

A provider that fails permanently (401, 403, 404, another 4xx, an answer that is not JSON, or
one that refuses even a small chunk as too long) fails the same way for every job: calling it
again costs a request and a dead letter each time. The first such failure *opens* the breaker
of that configuration (protocol, URL, model and key: `provider_id`) for `base_s`; while open,
jobs end without calling. Once the pause is over the breaker is *half-open*: one job gets the
probe (`probe`), the others still wait. A probe that succeeds closes the breaker (`reset`);
one that fails opens it again for twice as long, up to `max_s`. Failures of calls already in
flight when it opened do not lengthen the pause.

State is one HASH per configuration (failures, open `until` and `probe_until`, in ms on Redis's
clock), kept a while after its last failure, plus an index of every configuration that ever
tripped (for `/readyz` and `/metrics`: the API need not know the workers' provider settings).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared.settings import Settings
from shared.store import keys
from shared.store.client import Client, eval_in, guarded, guarded_read, text, ttl_ms
from shared.store.inflight import NOW

State = Literal["closed", "open", "half_open"]

# KEYS: breaker. -> {failures, until, probe_until, now} (ms).
READ = (
    NOW
    + """
local v = redis.call('HMGET', KEYS[1], 'failures', 'until', 'probe_until')
return {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), now}
"""
)

# KEYS: breaker. ARGV: probe ttl ms. 1 if the caller may send the half-open probe.
PROBE = (
    NOW
    + """
local v = redis.call('HMGET', KEYS[1], 'failures', 'until', 'probe_until')
if tonumber(v[1] or '0') == 0 or tonumber(v[2] or '0') > now then return 0 end
if tonumber(v[3] or '0') > now then return 0 end
redis.call('HSET', KEYS[1], 'probe_until', now + tonumber(ARGV[1]))
return 1
"""
)

# KEYS: breaker, index. ARGV: provider id, label, error, base ms, max ms, keep ms.
# Opens the breaker unless it is open already -> {failures, until, opened now (0/1)}.
TRIP = (
    NOW
    + """
local v = redis.call('HMGET', KEYS[1], 'failures', 'until')
local failures, open_until = tonumber(v[1] or '0'), tonumber(v[2] or '0')
if open_until > now then return {failures, open_until, 0} end
failures = failures + 1
local pause = math.min(tonumber(ARGV[5]), tonumber(ARGV[4]) * 2 ^ (failures - 1))
open_until = now + pause
redis.call('HSET', KEYS[1], 'failures', failures, 'until', open_until, 'probe_until', 0,
           'error', ARGV[3], 'label', ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[6]))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[6]))
return {failures, open_until, 1}
"""
)

# KEYS: breaker.
RELEASE_PROBE = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'probe_until', 0) end
return 1
"""

MAX_ERROR_CHARS = 300
# A worker process reads a breaker at most this often (the read rides on a job's claim); it
# learns of its own trips at once, of other processes' within this much.
MAX_AGE_S = 1.0


def provider_id(settings: Settings) -> str | None:
    """The breaker's id of the configured summarizer (None: the offline extractive one).

    A digest of protocol, URL, model and the API key's own digest: the key itself never
    reaches Redis, and a new key (or model, or URL) gets a closed breaker of its own.
    """
    if not settings.summarizer_url:
        return None
    secret = settings.summarizer_api_key
    key_digest = hashlib.sha256(secret.get_secret_value().encode() if secret else b"").hexdigest()
    parts = (settings.summarizer_protocol, settings.summarizer_url, settings.summarizer_model)
    material = "\n".join((*(p or "" for p in parts), key_digest))
    return hashlib.blake2b(material.encode(), digest_size=12).hexdigest()


def provider_label(settings: Settings) -> str:
    """How the breaker's configuration is named in `/readyz` and `/metrics` (no URL, no key)."""
    return f"{settings.summarizer_protocol}:{settings.summarizer_model or 'default'}"


@dataclass(frozen=True)
class BreakerState:
    """Where one configuration's breaker stands. `until`: epoch seconds it stays open until."""

    state: State = "closed"
    until: float | None = None
    failures: int = 0
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "state": self.state,
            "until": self.until,
            "failures": self.failures,
        }


CLOSED = BreakerState()
_SEVERITY: dict[State, int] = {"closed": 0, "half_open": 1, "open": 2}


def overall(states: Sequence[BreakerState]) -> dict[str, Any]:
    """The worst of `states` (closed when there are none), and each of them: `/readyz` detail."""
    worst = max(states, key=lambda s: _SEVERITY[s.state], default=CLOSED)
    return {
        "state": worst.state,
        "until": worst.until,
        "providers": [s.to_dict() for s in states],
    }


def state_of(reply: list[Any], label: str = "") -> BreakerState:
    """A `BreakerState` from the READ script's reply (Redis's TIME is wall-clock time)."""
    failures, until, _, now = (int(x) for x in reply)
    if failures == 0:
        return BreakerState(label=label)
    return BreakerState("open" if until > now else "half_open", until / 1000, failures, label)


class Breakers:
    """The breakers of every summarizer configuration, on one Redis client."""

    def __init__(self, client: Client, *, base_s: float, max_s: float) -> None:
        self._r = client
        self.base_s, self.max_s = base_s, max(base_s, max_s)
        self._seen: dict[str, tuple[float, BreakerState]] = {}  # provider -> (monotonic, state)

    def known(self, provider: str) -> BreakerState | None:
        """The breaker as this process last saw it, if that was under `MAX_AGE_S` ago and it
        cannot have changed on its own since (an open breaker whose pause ended is re-read)."""
        seen = self._seen.get(provider)
        if seen is None or time.monotonic() - seen[0] > MAX_AGE_S:
            return None
        state = seen[1]
        if state.state != "closed" and (state.until is None or time.time() >= state.until):
            return None
        return state

    def remember(self, provider: str, state: BreakerState) -> None:
        """What a claim just read (or this process just did) to the breaker."""
        self._seen[provider] = (time.monotonic(), state)

    @staticmethod
    def read_in(pipe: Any, provider: str) -> None:
        """Add the breaker's read to a pipeline (its reply goes to `state_of`)."""
        eval_in(pipe, READ, [keys.breaker(provider)], [])

    @guarded_read
    def state(self, provider: str) -> BreakerState:
        return state_of(self._r.eval(READ, 1, keys.breaker(provider)))

    @guarded
    def probe(self, provider: str, ttl_s: float) -> bool:
        """True for the one caller allowed to try the provider now that the pause is over."""
        return bool(self._r.eval(PROBE, 1, keys.breaker(provider), ttl_ms(ttl_s)))

    @guarded
    def trip(self, provider: str, label: str, error: str) -> tuple[BreakerState, bool]:
        """A permanent failure: open the breaker (for longer each time) unless it is open.

        Returns the breaker's state and whether this call opened it.
        """
        args = (
            provider,
            label,
            error[:MAX_ERROR_CHARS],
            ttl_ms(self.base_s),
            ttl_ms(self.max_s),
            ttl_ms(4 * self.max_s),  # a closed breaker's failures are forgotten after a while
        )
        ks = [keys.breaker(provider), keys.breakers()]
        failures, until, opened = (int(x) for x in self._r.eval(TRIP, 2, *ks, *args))
        state = BreakerState("open", until / 1000, failures, label)
        self.remember(provider, state)
        return state, bool(opened)

    @guarded
    def reset(self, provider: str) -> None:
        """The probe succeeded: close the breaker, forget its failures."""
        self._r.delete(keys.breaker(provider))
        self.remember(provider, CLOSED)

    @guarded
    def release_probe(self, provider: str) -> None:
        """The probe ended without an answer either way (a retryable error): let another try."""
        self._r.eval(RELEASE_PROBE, 1, keys.breaker(provider))

    @guarded_read
    def all(self) -> list[BreakerState]:
        """Every configuration that ever tripped (and is still remembered), by label."""
        index = {text(k): text(v) for k, v in self._r.hgetall(keys.breakers()).items()}
        pipe = self._r.pipeline(transaction=False)
        for provider in index:
            self.read_in(pipe, provider)
        replies = pipe.execute()
        states = [state_of(r, label) for r, label in zip(replies, index.values(), strict=True)]
        return sorted(states, key=lambda s: s.label)
