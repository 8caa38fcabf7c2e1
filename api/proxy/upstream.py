"""The providers the proxy forwards to: where they are, their pooled clients, the headers.

Where a provider is and its key (`Upstream`) is its dialect's to say, from its own settings
(api/proxy/dialects/). Each upstream gets one client with HTTP keep-alive, the connection
limits and the timeouts of the settings; the read timeout is between two bytes of an
answer, so a long streamed answer is never cut by it. Nothing here retries: a request that
may have reached the provider is not sent twice (only the overflow rule repeats a request,
and it changes the request). A client belongs to the event loop of its first request, so
clients are kept per loop, as the API's asyncio Redis clients are.

Tenants share nothing upstream (`UpstreamShare`): each tenant has pooled clients of its own,
and at most `PREFIT_UPSTREAM_TENANT_MAX_REQUESTS` requests at once in them (64; its pool holds
`PREFIT_UPSTREAM_MAX_CONNECTIONS`, 200, so it never waits on its pool either); past that a
request is refused at once (`OverShare`: the provider's 429 shape with `Retry-After`), so a
tenant holding streams that never end delays no other tenant's request at all. A streamed
answer holds its place until it is closed. Per API process.

No cookies: the clients keep no cookie jar (`NoCookies`), so nothing a provider sets on one
answer goes upstream with any later request (another tenant's, or with a tenant's own key),
and `Set-Cookie` is never passed back: a provider's cookies (Cloudflare's `__cf_bm`, ...)
are the deployment's session with it, for its domain, which no API client sends through
prefit.

The headers of a request to an upstream are its protocol's defaults, the client's headers it
passes on and the key that authenticates it (`upstream_headers`); the client gets the
provider's own answer headers back, less those of its connection and its cookies
(`passed_back`). An upstream that does not answer is a 502, or a 504 when it timed out
(`upstream_failure`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from http.cookiejar import Cookie, CookieJar
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import SecretStr

from api.proxy.identity import Caller
from api.requestlog import RequestLog
from shared.errors import OverShare
from shared.logs import get_logger
from shared.settings import Settings

if TYPE_CHECKING:  # the dialects make their upstreams: they import this module
    from api.proxy.dialects import Dialect

log = get_logger(__name__)


@dataclass(frozen=True)
class Upstream:
    """Where one provider's requests go (its API's root: endpoints are paths under it), and
    the deployment's key for it; each dialect makes its own from its provider's settings."""

    name: str
    root: str
    key: str | None


def secret(value: SecretStr | None) -> str | None:
    """The key a setting holds, if any."""
    return value.get_secret_value() if value is not None else None


class NoCookies(CookieJar):
    """A cookie jar that keeps nothing: the pooled clients forward no cookie ever set."""

    def set_cookie(self, cookie: Cookie) -> None:
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


RETRY_AFTER_S = 1  # a place in a tenant's share frees as soon as one of its requests ends


class UpstreamShare:
    """How many requests each tenant has upstream now, at most `cap` each (one per process),
    and how many it was refused; `/metrics` reads both (`counts`)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._lock = threading.Lock()  # the scrape reads from the threadpool

    def take(self, tenant: str) -> Callable[[], None]:
        """A place for one of `tenant`'s requests, and the call that gives it back (once);
        `OverShare` when the tenant holds all of its places."""
        with self._lock:
            full = self._held.get(tenant, 0) >= self.cap
            if full:
                self._refused[tenant] = self._refused.get(tenant, 0) + 1
            else:
                self._held[tenant] = self._held.get(tenant, 0) + 1
        if full:
            log.info("proxy.share_exceeded", tenant=tenant, cap=self.cap)
            raise OverShare(
                f"too many requests at once: this API key has {self.cap} requests in flight "
                f"upstream, its share (PREFIT_UPSTREAM_TENANT_MAX_REQUESTS); retry when one ends",
                retry_after=RETRY_AFTER_S,
            )
        given = False

        def give_back() -> None:
            nonlocal given
            with self._lock:
                if given:
                    return
                given = True
                left = self._held[tenant] - 1
                if left:
                    self._held[tenant] = left
                else:
                    del self._held[tenant]

        return give_back

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(requests in flight, requests refused so far) by tenant."""
        with self._lock:
            return dict(self._held), dict(self._refused)


class _Held(httpx.AsyncByteStream):
    """A streamed answer's body that gives its place in the share back once closed."""

    def __init__(self, stream: httpx.AsyncByteStream, give_back: Callable[[], None]) -> None:
        self._stream = stream
        self._give_back = give_back

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._give_back()


class UpstreamClients:
    """Pooled clients, one per upstream, tenant and event loop (no cookie jar), and each
    tenant's share of them; `aclose` the loop's at shutdown."""

    def __init__(self, settings: Settings) -> None:
        self._timeout = httpx.Timeout(
            connect=settings.upstream_connect_timeout_s,
            read=settings.upstream_read_timeout_s,
            write=settings.upstream_write_timeout_s,
            pool=settings.upstream_pool_timeout_s,
        )
        self._limits = httpx.Limits(
            max_connections=settings.upstream_max_connections,
            max_keepalive_connections=settings.upstream_max_connections,
            keepalive_expiry=settings.upstream_keepalive_s,
        )
        self.share = UpstreamShare(settings.upstream_tenant_max_requests)
        self._clients: dict[tuple[asyncio.AbstractEventLoop, str, str], httpx.AsyncClient] = {}
        self._lock = threading.Lock()

    def client(self, name: str, tenant: str) -> httpx.AsyncClient:
        """The pooled client of upstream `name` for `tenant` on the running loop (made on
        first use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [k for k in self._clients if k[0].is_closed()]:
                del self._clients[old]
            found = self._clients.get((loop, name, tenant))
            if found is None:
                found = httpx.AsyncClient(
                    timeout=self._timeout, limits=self._limits, cookies=NoCookies()
                )
                self._clients[(loop, name, tenant)] = found
            return found

    async def send(
        self,
        upstream: Upstream,
        headers: Mapping[str, str],
        body: bytes,
        path: str,
        *,
        tenant: str,
    ) -> httpx.Response:
        """POST `body` to `upstream` at `path` (under its root, with its query) for
        `tenant`, within its share; the answer's body is left unread (streamed), holding
        its place until closed."""
        give_back = self.share.take(tenant)
        try:
            client = self.client(upstream.name, tenant)
            request = client.build_request(
                "POST", upstream.root + path, headers=dict(headers), content=body
            )
            answer = await client.send(request, stream=True)
        except BaseException:
            give_back()
            raise
        assert isinstance(answer.stream, httpx.AsyncByteStream)
        answer.stream = _Held(answer.stream, give_back)
        return answer

    async def request(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        tenant: str,
    ) -> httpx.Response:
        """`method` `path` (under `upstream`'s root, with its query) for `tenant`, within
        its share, read."""
        give_back = self.share.take(tenant)
        try:
            client = self.client(upstream.name, tenant)
            url = upstream.root + path
            return await client.request(method, url, headers=dict(headers), content=body or None)
        finally:
            give_back()

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [k for k in self._clients if k[0] is loop]
            clients = [self._clients.pop(k) for k in mine]
        for client in clients:
            await client.aclose()


# --- the headers --------------------------------------------------------------------------

# Not passed back from the upstream's answer: they describe its connection and encoding, or
# are the deployment's cookies with the provider (module docstring).
HOP = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}
    | {"date", "server", "set-cookie", "set-cookie2"}
)


# Who the client's own key bills (`organization=`, `project=` of the SDK): forwarded with
# that key only, since the deployment's key belongs to an account of its own.
ACCOUNT = ("openai-organization", "openai-project")


def upstream_headers(
    dialect: Dialect, caller: Caller, key: str | None, client: Mapping[str, str]
) -> dict[str, str]:
    """The headers of a request to `dialect`'s upstream: its defaults, the client's headers
    it passes on, and the client's own provider auth when forwarded, else the deployment's
    `key`, else (open mode, no deployment key) the SDK's; the client's account headers go
    with its own key only."""
    out = {"content-type": "application/json", **dialect.defaults()}
    out.update({h: client[h] for h in dialect.forwarded if h in client})
    if caller.provider_auth:
        out.update(caller.provider_auth)
        out.update({h: client[h] for h in ACCOUNT if h in client})
    elif key:
        out.update(dialect.auth(key))
    elif caller.fallback_auth:
        out.update(caller.fallback_auth)
        out.update({h: client[h] for h in ACCOUNT if h in client})
    return out


def own_key(dialect: Dialect, caller: Caller) -> bool:
    """Whether `caller`'s requests go upstream with its own provider key (forwarded, or in
    open mode for lack of a deployment key): the provider then keeps its objects apart
    itself; with the deployment's key prefit must (shared/store/ownership.py)."""
    return bool(caller.provider_auth) or (not dialect.upstream.key and bool(caller.fallback_auth))


def passed_back(upstream: Mapping[str, str]) -> dict[str, str]:
    """The upstream answer's headers the client gets (rate limits, request ids, ...)."""
    return {k: v for k, v in upstream.items() if k.lower() not in HOP}


def upstream_failure(exc: httpx.TransportError, name: str, rec: RequestLog) -> tuple[int, str]:
    """The status and message of upstream `name` not answering (`exc`): 504 when it timed
    out, else 502; logged, and noted in `rec`."""
    timeout = isinstance(exc, httpx.TimeoutException)
    rec.error = "UpstreamTimeout" if timeout else "UpstreamUnreachable"
    log.warning("proxy.upstream_failed", upstream=name, error=type(exc).__name__)
    return (504 if timeout else 502), f"{name} upstream {'timed out' if timeout else 'unreachable'}"
