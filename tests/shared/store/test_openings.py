"""The tenant's memory of repeated openings: preambles learned from distinct conversations."""

from __future__ import annotations

import asyncio
import socket

import pytest
import redis.asyncio

from shared.head import head_of, task_digest
from shared.store import keys
from shared.store.openings import Openings
from tests.redisbackend import async_store_client
from tests.shared import preambles as p

pytestmark = pytest.mark.anyio

PREAMBLE_KEY = task_digest({"role": "user", "content": p.PREAMBLE})


async def learn(redis_url: str, memory: Openings, tenant: str, *tasks: str) -> list[frozenset[str]]:
    """The preambles found for a conversation on each of `tasks`, in order."""
    client = async_store_client(redis_url)
    try:
        return [await memory.preambles(client, tenant, p.opened(t)) for t in tasks]
    finally:
        await client.aclose()


async def test_an_opening_of_two_conversations_is_a_preamble_for_the_second(
    redis_url: str, tenant: str
) -> None:
    """The first conversation keeps its head; the second and third find their task past it."""
    memory = Openings()
    found = await learn(
        redis_url, memory, tenant, "Fix the login bug", "Add a dark mode", "Port to 3.13"
    )
    assert found == [frozenset(), frozenset({PREAMBLE_KEY}), frozenset({PREAMBLE_KEY})]
    third = p.opened("Port to 3.13")
    assert head_of(third, preambles=found[2]).task == 3 and head_of(third).task == 1
    again = await learn(redis_url, Openings(), tenant, "Fix the login bug", "Add a dark mode")
    assert again == found[:2]  # another process reads the same memory, and the first stays put
    assert memory.cached(tenant, third) == frozenset({PREAMBLE_KEY})


async def test_tenants_do_not_share_the_memory(redis_url: str, tenant: str) -> None:
    """What one tenant's conversations taught never applies to another's."""
    memory = Openings()
    await learn(redis_url, memory, tenant, "Fix the login bug", "Add a dark mode")
    assert await learn(redis_url, memory, tenant + "-b", "Port to 3.13") == [frozenset()]


async def test_only_hashes_are_stored_with_an_expiry(redis_url: str, tenant: str) -> None:
    """The memory holds the follow-up's hash under the opening's hash, expiring."""

    async def read() -> tuple[bytes | None, int]:
        client = async_store_client(redis_url)
        try:
            key = keys.opening(tenant, PREAMBLE_KEY)
            return await client.get(key), await client.ttl(key)
        finally:
            await client.aclose()

    await learn(redis_url, Openings(), tenant, "Fix the login bug")
    value, ttl = await read()
    for _ in range(40):  # on a cluster the write may still be on its way to the slot's node
        if value is not None:
            break
        await asyncio.sleep(0.05)
        value, ttl = await read()
    assert value == task_digest({"role": "user", "content": "Fix the login bug"}).encode()
    assert 0 < ttl <= 30 * 86_400


def dead_client() -> redis.asyncio.Redis:
    """A client of a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return redis.asyncio.Redis(port=port, socket_connect_timeout=0.1)


async def ask_dead(memory: Openings, tenant: str, task: str) -> frozenset[str]:
    """The preambles `memory` finds for a conversation on `task` with Redis gone."""
    client = dead_client()
    try:
        return await memory.preambles(client, tenant, p.opened(task))
    finally:
        await client.aclose()


async def test_a_redis_fault_leaves_the_transcript_only_rule(tenant: str) -> None:
    """No Redis: no preamble, no error."""
    assert await ask_dead(Openings(), tenant, "Fix the login bug") == frozenset()


async def test_a_decision_once_known_outlives_a_fault(redis_url: str, tenant: str) -> None:
    """Past its cache time, a decision the process knew stands while Redis is gone: the head
    it gave does not flip back."""
    memory = Openings(cache_s=0.0)
    await learn(redis_url, memory, tenant, "Fix the login bug", "Add a dark mode")
    assert await ask_dead(memory, tenant, "Add a dark mode") == frozenset({PREAMBLE_KEY})
    assert await ask_dead(memory, tenant, "Fix the login bug") == frozenset()
