"""Which provider-stored objects a tenant created through the proxy: only those are its own.

The proxy reaches a provider with the deployment's key, so the provider sees one account:
any tenant could read or delete any response it stored. prefit therefore keeps, per tenant
and kind (`keys.owned`: a sorted set of ids scored by when they were made), the ids of the
objects the tenant's requests created (a Responses API answer's `id`), and answers an id
that is not there with the provider's own 404 without asking it. Bounded: ids older than
the provider's retention are dropped (the provider has deleted them), and past `max_ids` the
oldest go first (those become unreachable through prefit, as they would be past retention).
One round trip per request; a fault is `StoreUnavailable` (an unknown owner is never
assumed to be the caller).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from shared.errors import StoreUnavailable
from shared.store import keys

AsyncClient = redis.asyncio.Redis | AsyncRedisCluster
TIMEOUT_S = 1.0  # a request waits no longer on the check


class Ownership:
    """The ids of each tenant's provider objects (one per app)."""

    def __init__(self, *, max_ids: int, timeout_s: float = TIMEOUT_S) -> None:
        self.max_ids = max_ids
        self.timeout_s = timeout_s

    async def record(
        self,
        client: AsyncClient,
        tenant: str,
        kind: str,
        object_id: str | Sequence[str],
        retention_s: int,
    ) -> None:
        """`object_id` (or each of several) is the tenant's (`StoreUnavailable` if Redis
        does not say so)."""
        key, now = keys.owned(tenant, kind), time.time()
        ids = [object_id] if isinstance(object_id, str) else list(object_id)
        if not ids:
            return
        pipe = client.pipeline(transaction=False)  # one key: one slot, one round trip
        pipe.zadd(key, dict.fromkeys(ids, now))
        pipe.zremrangebyscore(key, "-inf", now - retention_s)
        pipe.zremrangebyrank(key, 0, -self.max_ids - 1)
        pipe.expire(key, retention_s)
        await self._run(pipe.execute())

    async def owns(
        self, client: AsyncClient, tenant: str, kind: str, object_id: str, retention_s: int
    ) -> bool:
        """Whether the tenant created `object_id` within the retention."""
        made = await self._run(client.zscore(keys.owned(tenant, kind), object_id))
        return made is not None and float(made) > time.time() - retention_s

    async def owns_all(
        self, client: AsyncClient, tenant: str, kind: str, ids: Sequence[str], retention_s: int
    ) -> bool:
        """Whether the tenant created every one of `ids` within the retention."""
        if not ids:
            return True
        made = await self._run(client.zmscore(keys.owned(tenant, kind), list(ids)))
        oldest = time.time() - retention_s
        return all(m is not None and float(m) > oldest for m in made)

    async def forget(self, client: AsyncClient, tenant: str, kind: str, object_id: str) -> None:
        """`object_id` is gone (deleted at the provider)."""
        await self._run(client.zrem(keys.owned(tenant, kind), object_id))

    async def _run(self, command: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(command, self.timeout_s)
        except (TimeoutError, redis.exceptions.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis did not answer ({type(exc).__name__})") from None
