"""The suite's choice of Redis, and the fakeredis server it falls back to."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis

from shared.commands.redisproc import reachable
from tests import redisbackend
from tests.redisbackend import SWITCH, FakeRedisServer, backend


@pytest.fixture
def choose(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A fresh choice under a patched environment; the session's own is restored after."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("PREFIT_REDIS_URL", raising=False)
    monkeypatch.delenv(SWITCH, raising=False)
    backend.cache_clear()
    yield monkeypatch
    backend.cache_clear()


def test_the_switch_and_the_fallback(choose: pytest.MonkeyPatch) -> None:
    """fakeredis when asked or when no redis-server exists; `server` refuses to fall back."""
    choose.setenv(SWITCH, "fakeredis")
    assert backend().kind == "fakeredis"
    backend.cache_clear()
    choose.delenv(SWITCH)
    choose.setattr(redisbackend, "find_redis_server", lambda: None)
    assert backend() == redisbackend.Backend("fakeredis", "no redis-server installed")
    assert "fakeredis" in redisbackend.describe()
    backend.cache_clear()
    choose.setenv(SWITCH, "server")
    with pytest.raises(pytest.UsageError, match="no redis-server is installed"):
        backend()
    choose.setenv(SWITCH, "memcached")
    with pytest.raises(pytest.UsageError, match="must be 'server', 'fakeredis' or 'cluster'"):
        backend()


def test_the_cluster_switch_needs_redis_cli(choose: pytest.MonkeyPatch) -> None:
    """`cluster` is chosen when asked, named in the header, and refused without redis-cli."""
    choose.setenv(SWITCH, "cluster")
    choose.setattr(redisbackend, "find_redis_cli", lambda server: "/usr/bin/redis-cli")
    assert backend() == redisbackend.Backend("cluster", f"{SWITCH}=cluster")
    assert "Redis Cluster" in redisbackend.describe()
    backend.cache_clear()
    choose.setattr(redisbackend, "find_redis_cli", lambda server: None)
    with pytest.raises(pytest.UsageError, match="needs redis-server and redis-cli"):
        backend()


def test_a_reachable_redis_url_wins(choose: pytest.MonkeyPatch, redis_url: str) -> None:
    """REDIS_URL, when set and answering, is used as it is."""
    choose.setenv("REDIS_URL", redis_url)
    assert backend() == redisbackend.Backend("url", "REDIS_URL is set and answers", redis_url)


@pytest.mark.slow
def test_fake_server_runs_lua_with_sha1hex_and_stops() -> None:
    """The fake serves over TCP, its Lua has redis.sha1hex as Redis computes it, and stop()
    ends it."""
    server = FakeRedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        digest = client.eval("return redis.sha1hex(ARGV[1])", 0, "abc")
        client.close()
        assert digest == hashlib.sha1(b"abc").hexdigest().encode()
    finally:
        server.stop()
    assert not reachable(server.url, timeout=0.2)
