"""Connection pooling for hundreds of concurrent provider calls.

httpcore 1.0's pool does O(connections) bookkeeping per queued request on every pass,
so one `httpx.AsyncClient` with 300 requests in flight spends seconds of CPU in the pool
(encode/httpcore#1035); its idle-connection check is even quadratic in the connections.
A worker keeps ~200 summarizer calls in flight, so connections are spread over shards of
at most `SHARD_CONNECTIONS` each, made on demand, and each request goes to the least busy
shard. Small shards are cheapest: in the worker benchmark (256 in flight) the worker's CPU
per task was ~7.5 ms with shards of 32, ~5.9 ms with 8 and ~5.3 ms with 4.
"""

from __future__ import annotations

import asyncio
import functools
import math
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

SHARD_CONNECTIONS = 4


@dataclass
class _Shard:
    client: httpx.AsyncClient
    in_flight: int = 0


class ShardedPool:
    """`post` over up to `max_connections` pooled connections, in shards of httpx clients.

    Clients belong to the event loop of their first request; a call on another loop (a
    process that runs `asyncio.run` per task) gets fresh ones, as the old ones cannot be
    used or closed from there.
    """

    def __init__(
        self,
        *,
        timeout: httpx.Timeout,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: shared by every shard
    ) -> None:
        self.timeout = timeout
        self.max_connections = max(1, max_connections)
        self._shard_count = math.ceil(self.max_connections / SHARD_CONNECTIONS)
        self._per_shard = math.ceil(self.max_connections / self._shard_count)
        self.limits = httpx.Limits(
            max_connections=self._per_shard, max_keepalive_connections=self._per_shard
        )
        self._transport = transport
        self._shards: list[_Shard] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def post(self, url: str, *, headers: dict[str, str], json: Any) -> httpx.Response:
        shard = self._pick()
        shard.in_flight += 1
        try:
            return await shard.client.post(url, headers=headers, json=json)
        finally:
            shard.in_flight -= 1

    async def aclose(self) -> None:
        shards, self._shards = self._shards, []
        for shard in shards:
            await shard.client.aclose()

    def _pick(self) -> _Shard:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._shards, self._loop = [], loop
        if self._shards:
            idle = min(self._shards, key=lambda s: s.in_flight)
            if idle.in_flight < self._per_shard or len(self._shards) >= self._shard_count:
                return idle
        shard = _Shard(self._client())
        self._shards.append(shard)
        return shard

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=self.timeout,
            limits=self.limits,
            transport=self._transport,
            verify=_ssl_context(),
        )


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # building one loads the CA bundle (~0.2 s); one per process is enough and thread-safe
    return httpx.create_ssl_context()
