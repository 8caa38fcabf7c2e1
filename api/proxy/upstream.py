"""The providers the proxy forwards to: one pooled `httpx.AsyncClient` per upstream.

Each upstream (OpenAI, Anthropic) gets one client with HTTP keep-alive, the connection
limits and the timeouts of the settings; the read timeout is between two bytes of an
answer, so a long streamed answer is never cut by it. Nothing here retries: a request that
may have reached the provider is not sent twice (only the overflow rule repeats a request,
and it changes the request). A client belongs to the event loop of its first request, so
clients are kept per loop, as the API's asyncio Redis clients are.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from shared.settings import Settings

OPENAI, ANTHROPIC = "openai", "anthropic"


@dataclass(frozen=True)
class Upstream:
    """Where one protocol's requests go, and the deployment's key for it."""

    name: str
    url: str  # the full URL of the endpoint
    key: str | None
    root: str = ""  # the API's base URL, ending in /v1 (other endpoints: `Transport.forward`)


def upstreams_of(settings: Settings) -> dict[str, Upstream]:
    """The two upstreams of the settings (`PREFIT_OPENAI_*`, `PREFIT_ANTHROPIC_*`)."""
    openai_key = settings.openai_api_key
    anthropic_key = settings.anthropic_api_key
    openai_root = settings.openai_base_url.rstrip("/")
    anthropic_root = settings.anthropic_base_url.rstrip("/").removesuffix("/v1") + "/v1"
    return {
        OPENAI: Upstream(
            OPENAI,
            openai_root + "/chat/completions",
            openai_key.get_secret_value() if openai_key else None,
            openai_root,
        ),
        ANTHROPIC: Upstream(
            ANTHROPIC,
            anthropic_root + "/messages",
            anthropic_key.get_secret_value() if anthropic_key else None,
            anthropic_root,
        ),
    }


class Transport:
    """Pooled clients, one per upstream and event loop; `aclose` the loop's at shutdown."""

    def __init__(self, settings: Settings) -> None:
        self.upstreams = upstreams_of(settings)
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
        self, name: str, headers: Mapping[str, str], body: bytes, path: str | None = None
    ) -> httpx.Response:
        """POST `body` to upstream `name` (at `path` under its /v1, else its endpoint); the
        answer's body is left unread (streamed)."""
        client = self.client(name)
        upstream = self.upstreams[name]
        url = upstream.root + path if path is not None else upstream.url
        request = client.build_request("POST", url, headers=dict(headers), content=body)
        return await client.send(request, stream=True)

    async def forward(
        self, name: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> httpx.Response:
        """`method` `path` (under the API's /v1, with its query) of upstream `name`, read."""
        client = self.client(name)
        url = self.upstreams[name].root + path
        return await client.request(method, url, headers=dict(headers), content=body or None)

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [k for k in self._clients if k[0] is loop]
            clients = [self._clients.pop(k) for k in mine]
        for client in clients:
            await client.aclose()
