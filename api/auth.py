"""Bearer-key authentication: the tenant comes from the key, and only from the key.

`PREFIT_API_KEYS` holds `tenant:key` pairs. Only SHA-256 digests of the keys are kept, and a
presented key is compared with every digest by `hmac.compare_digest` (no early exit), so
neither the keys nor which one matched leak through memory dumps or timing.

With no keys configured the service has one tenant, `local`, anyone who reaches it is that
tenant, so it serves loopback only: `LoopbackOnly` refuses (403) every request that arrived
on a non-loopback local address (ASGI `scope["server"]`: the address of the socket the
connection came in on, whatever the bind), unless the operator opted in with
`PREFIT_ALLOW_OPEN=true`. A local address that is not an IP (a Unix socket, an in-process
client) counts as loopback; an unknown one does not.

Key before body (`KeyFirst`): every route of the explicit API that needs a tenant (its
handler depends on `get_tenant`, whatever the route) is answered 401 from the headers alone,
before a byte of its body is read or parsed: the same 401 for any body, a truncated or a
90 MB one included, and an unauthenticated client costs the service no memory. (The
proxy's routes authenticate first by themselves, with the provider's headers and errors.)
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_response
from api.requestlog import request_log
from shared.errors import ConfigError, Forbidden, InvalidId, Unauthorized
from shared.store import keys

LOCAL_TENANT = "local"
SCHEME = "bearer"
OPEN_MODE_REFUSAL = (
    "open mode (no PREFIT_API_KEYS) serves loopback only, and this request arrived on "
    "{address}: set PREFIT_API_KEYS (tenant:key,...) or, to serve anyone who can reach this "
    "address as one tenant, PREFIT_ALLOW_OPEN=true"
)


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


def metrics_access(token: SecretStr | None, authorization: str | None) -> bool:
    """Whether a scrape may see per-tenant series: only with `PREFIT_METRICS_TOKEN` as its
    bearer token. Without a header it sees aggregates; a wrong token is `Unauthorized`."""
    if token is None or not authorization:
        return False
    scheme, _, presented = authorization.strip().partition(" ")
    expected = _digest(token.get_secret_value())
    if scheme.lower() != SCHEME or not hmac.compare_digest(expected, _digest(presented.strip())):
        raise Unauthorized("invalid metrics token (PREFIT_METRICS_TOKEN)")
    return True


def is_loopback(host: Any) -> bool:
    """True for a loopback IP (IPv4-mapped too) or `localhost`; False for other IPs."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def arrived_locally(scope: Scope) -> bool:
    """Whether the request came in on a loopback address (or a non-IP one: a Unix socket)."""
    server = scope.get("server")
    if not server:
        return False
    return _local_address(server[0])


@functools.lru_cache(maxsize=256)  # a server listens on a few addresses: parse each once
def _local_address(host: Any) -> bool:
    try:
        ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return host is not None  # a socket path, or an in-process test client's name
    return is_loopback(host)


class LoopbackOnly:
    """Refuse, 403 `Forbidden`, every request that did not arrive on a loopback address."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or arrived_locally(scope):
            await self.app(scope, receive, send)
            return
        request_log(Request(scope)).error = "Forbidden"
        address = (scope.get("server") or ("an unknown address",))[0]
        refused = Forbidden(OPEN_MODE_REFUSAL.format(address=address))
        await error_response(refused)(scope, receive, send)


class KeyFirst:
    """Refuse (401) a request to a route that needs a tenant when its key names none, from
    its headers, before its body is read (module docstring)."""

    def __init__(
        self, app: ASGIApp, keyring: KeyRing, routes: list[BaseRoute], needs_tenant: Any
    ) -> None:
        self.app = app
        self.keyring = keyring
        self.routes = routes  # the explicit API's (api/routes.py)
        self.needs_tenant = needs_tenant  # the dependency that makes a route need a key
        self._guarded: list[BaseRoute] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.keyring.open or not self._guards(scope):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self.keyring.tenant_for(headers.get("authorization"))
        except Unauthorized as exc:
            request_log(Request(scope)).error = Unauthorized.__name__
            response = error_response(exc)
            if "content-length" in headers or "transfer-encoding" in headers:
                response.headers["connection"] = "close"  # its body is never read
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _guards(self, scope: Scope) -> bool:
        """Whether `scope`'s path is one of a route that needs a tenant (any method)."""
        if self._guarded is None:
            self._guarded = [r for r in self.routes if _depends_on(r, self.needs_tenant)]
        return any(r.matches(scope)[0] != Match.NONE for r in self._guarded)


def _depends_on(route: BaseRoute, call: Any) -> bool:
    """Whether `route` (a FastAPI route) has `call` among its dependencies, however deep."""
    stack = list(getattr(getattr(route, "dependant", None), "dependencies", ()))
    while stack:
        dependant = stack.pop()
        if dependant.call is call:
            return True
        stack.extend(dependant.dependencies)
    return False
