"""The providers the proxy forwards to: where they are, their pooled clients, the headers.

Where a provider is and its key (`Upstream`) is its dialect's to say, from its own settings
(api/proxy/dialects/). Each upstream gets one client with HTTP keep-alive, the connection
limits and the timeouts of the settings; the read timeout is between two bytes of an
answer, so a long streamed answer is never cut by it. Nothing here retries: a request that
may have reached the provider is not sent twice (only the overflow rule repeats a request,
and it changes the request). A client belongs to the event loop of its first request, so
clients are kept per loop, as the API's asyncio Redis clients are.

The headers of a request to an upstream are its protocol's defaults, the client's headers it
passes on and the key that authenticates it (`upstream_headers`); the client gets the
provider's own answer headers back, less those of its connection (`passed_back`). An
upstream that does not answer is a 502, or a 504 when it timed out (`upstream_failure`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from pydantic import SecretStr

from api.proxy.identity import Caller
from api.requestlog import RequestLog
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


class UpstreamClients:
    """Pooled clients, one per upstream and event loop; `aclose` the loop's at shutdown."""

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
        self._clients: dict[tuple[asyncio.AbstractEventLoop, str], httpx.AsyncClient] = {}
        self._lock = threading.Lock()

    def client(self, name: str) -> httpx.AsyncClient:
        """The pooled client of upstream `name` on the running loop (made on first use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [k for k in self._clients if k[0].is_closed()]:
                del self._clients[old]
            found = self._clients.get((loop, name))
            if found is None:
                found = httpx.AsyncClient(timeout=self._timeout, limits=self._limits)
                self._clients[(loop, name)] = found
            return found

    async def send(
        self, upstream: Upstream, headers: Mapping[str, str], body: bytes, path: str
    ) -> httpx.Response:
        """POST `body` to `upstream` at `path` (under its root, with its query); the
        answer's body is left unread (streamed)."""
        client = self.client(upstream.name)
        request = client.build_request(
            "POST", upstream.root + path, headers=dict(headers), content=body
        )
        return await client.send(request, stream=True)

    async def request(
        self, upstream: Upstream, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> httpx.Response:
        """`method` `path` (under `upstream`'s root, with its query), read."""
        client = self.client(upstream.name)
        url = upstream.root + path
        return await client.request(method, url, headers=dict(headers), content=body or None)

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [k for k in self._clients if k[0] is loop]
            clients = [self._clients.pop(k) for k in mine]
        for client in clients:
            await client.aclose()


# --- the headers --------------------------------------------------------------------------

# Not passed back from the upstream's answer: they describe its connection and encoding.
HOP = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}
    | {"date", "server"}
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
