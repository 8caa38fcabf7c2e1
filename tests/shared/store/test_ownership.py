"""The ids of the provider objects each tenant made: its own only, bounded, for the
provider's retention; a dead Redis is `StoreUnavailable`, never an answer."""

from __future__ import annotations

import socket

import pytest
import redis.asyncio

from shared.errors import ConfigError, StoreUnavailable
from shared.store import keys
from shared.store.ownership import Ownership
from tests.redisbackend import async_store_client

pytestmark = pytest.mark.anyio
DAY = 86_400


async def test_an_id_is_its_makers_alone_until_forgotten(redis_url: str, tenant: str) -> None:
    """Recorded for one tenant, an id is not another's; forgotten, not even its own."""
    client = async_store_client(redis_url)
    owned = Ownership(max_ids=10)
    try:
        await owned.record(client, tenant, "responses", "resp_a", 30 * DAY)
        assert await owned.owns(client, tenant, "responses", "resp_a", 30 * DAY)
        assert not await owned.owns(client, tenant + "-other", "responses", "resp_a", 30 * DAY)
        assert not await owned.owns(client, tenant, "responses", "resp_b", 30 * DAY)
        await owned.forget(client, tenant, "responses", "resp_a")
        assert not await owned.owns(client, tenant, "responses", "resp_a", 30 * DAY)
    finally:
        await client.aclose()


async def test_several_ids_are_owned_together_or_not_at_all(redis_url: str, tenant: str) -> None:
    """A response's output items, recorded at once, are owned all together; one stranger
    among them and the set is not the tenant's."""
    client = async_store_client(redis_url)
    owned = Ownership(max_ids=10)
    try:
        await owned.record(client, tenant, "items", ["msg_a", "rs_b"], 30 * DAY)
        assert await owned.owns_all(client, tenant, "items", ["msg_a", "rs_b"], 30 * DAY)
        assert not await owned.owns_all(client, tenant, "items", ["msg_a", "msg_x"], 30 * DAY)
        assert await owned.owns_all(client, tenant, "items", [], 30 * DAY)
    finally:
        await client.aclose()


async def test_the_memory_is_bounded_by_count_and_retention(redis_url: str, tenant: str) -> None:
    """Past `max_ids` the oldest go first; ids past the retention are no one's; the key
    expires with the retention."""
    client = async_store_client(redis_url)
    owned = Ownership(max_ids=3)
    key = keys.owned(tenant, "responses")
    try:
        await client.zadd(key, {"resp_old": 1.0})  # made in 1970: past any retention
        assert not await owned.owns(client, tenant, "responses", "resp_old", 30 * DAY)
        for n in range(5):
            await owned.record(client, tenant, "responses", f"resp_{n}", 30 * DAY)
        members = sorted(m.decode() for m in await client.zrange(key, 0, -1))
        assert members == ["resp_2", "resp_3", "resp_4"]
        assert 29 * DAY < await client.ttl(key) <= 30 * DAY
    finally:
        await client.aclose()


async def test_no_redis_is_unavailable_not_an_answer(tenant: str) -> None:
    """A check against a Redis that is not there raises, so the proxy answers 503."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = redis.asyncio.Redis(port=port, socket_connect_timeout=0.2)
    with pytest.raises(StoreUnavailable):
        await Ownership(max_ids=3).owns(client, tenant, "responses", "resp_a", DAY)
    await client.aclose()


def test_only_known_kinds_have_keys() -> None:
    """The key of an unknown kind is a `ConfigError`, not a new key space."""
    with pytest.raises(ConfigError):
        keys.owned("t", "files")
