"""Bearer-key authentication: the tenant comes from the key, and only from the key.

`PREFIT_API_KEYS` holds `tenant:key` pairs. Only SHA-256 digests of the keys are kept, and a
presented key is compared with every digest by `hmac.compare_digest` (no early exit), so
neither the keys nor which one matched leak through memory dumps or timing. With no keys
configured the service has one tenant, `local`, and must only listen on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from shared import keys
from shared.errors import ConfigError, InvalidId, Unauthorized

LOCAL_TENANT = "local"
SCHEME = "bearer"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyRing:
    """The configured API keys, as digests; empty means open (loopback-only) mode."""

    entries: tuple[tuple[bytes, str], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> KeyRing:
        """Read `tenant:key,tenant2:key2`; `ConfigError` (never echoing a key) if malformed."""
        entries: list[tuple[bytes, str]] = []
        seen: set[bytes] = set()
        for n, item in enumerate(p.strip() for p in spec.split(",")):
            if not item:
                continue
            tenant, sep, key = item.partition(":")
            if not sep or not key.strip():
                raise ConfigError(f"PREFIT_API_KEYS entry {n + 1}: expected 'tenant:key'")
            try:
                keys.check_tenant(tenant.strip())
            except InvalidId as exc:
                raise ConfigError(f"PREFIT_API_KEYS entry {n + 1}: {exc}") from None
            digest = _digest(key.strip())
            if digest in seen:
                raise ConfigError(f"PREFIT_API_KEYS entry {n + 1}: the same key is listed twice")
            seen.add(digest)
            entries.append((digest, tenant.strip()))
        return cls(tuple(entries))

    @property
    def open(self) -> bool:
        """True when no key is configured: one local tenant, loopback only."""
        return not self.entries

    @property
    def tenants(self) -> list[str]:
        """Every tenant a key names (the local tenant in open mode)."""
        if self.open:
            return [LOCAL_TENANT]
        return sorted({tenant for _, tenant in self.entries})

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of an `Authorization` header value; `Unauthorized` if it names none."""
        if self.open:
            return LOCAL_TENANT
        if not authorization:
            raise Unauthorized("missing 'Authorization: Bearer <key>' header")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != SCHEME or not key.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <key>'")
        return self.tenant_for_key(key)

    def tenant_for_key(self, key: str) -> str:
        """The tenant of a bare key (as `x-api-key` carries it); `Unauthorized` if none."""
        if self.open:
            return LOCAL_TENANT
        if not key.strip():
            raise Unauthorized("empty API key")
        presented = _digest(key.strip())
        found: str | None = None
        for digest, tenant in self.entries:  # no early exit: constant time in the match
            if hmac.compare_digest(digest, presented):
                found = tenant
        if found is None:
            raise Unauthorized("invalid API key")
        return found
