"""RedisProcess: a throwaway redis-server that can be stopped, killed and restarted."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from shared.commands.redisproc import RedisProcess, free_port, reachable
from shared.errors import ConfigError, StoreUnavailable
from tests.redisbackend import needs_redis_server


@needs_redis_server
def test_start_stop_and_temp_dir_cleanup() -> None:
    """A started server answers PING; stop() ends it and removes the directory it made."""
    proc = RedisProcess().start()
    folder = proc.dir
    assert folder is not None and folder.is_dir()
    assert reachable(proc.url) and proc.running and proc.pid is not None
    proc.stop()
    assert not reachable(proc.url)
    assert not proc.running and not folder.exists()


@needs_redis_server
def test_no_persistence_by_default() -> None:
    """By default nothing is saved: no RDB snapshots, no AOF."""
    with RedisProcess() as proc:
        client = redis.Redis.from_url(proc.url)
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        client.close()


@needs_redis_server
def test_restart_keeps_the_port() -> None:
    """restart() and kill()+restart() come back on the same port."""
    with RedisProcess() as proc:
        port, url = proc.port, proc.url
        proc.restart()
        assert (proc.port, proc.url) == (port, url) and reachable(url)
        proc.kill()
        assert not reachable(url)
        proc.restart()
        assert proc.port == port and reachable(url)


@needs_redis_server
def test_appendonly_keeps_data_across_kill(tmp_path: Path) -> None:
    """With appendonly and a directory of ours, a SIGKILLed server restarts with its data."""
    with RedisProcess(appendonly=True, dir=tmp_path) as proc:
        redis.Redis.from_url(proc.url).set("k", "v")
        proc.kill()
        proc.restart()
        assert redis.Redis.from_url(proc.url).get("k") == b"v"
    assert tmp_path.is_dir()  # a directory we were given is never removed


def test_missing_executable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No redis-server anywhere, or a wrong path, raises ConfigError with a clear message."""
    monkeypatch.setattr("shared.commands.redisproc.find_redis_server", lambda: None)
    with pytest.raises(ConfigError, match="no redis-server found"):
        RedisProcess().start()
    with pytest.raises(ConfigError, match="does not exist"):
        RedisProcess(executable="/nonexistent/redis-server").start()


@needs_redis_server
def test_fixed_port_in_use_is_store_unavailable() -> None:
    """A fixed port held by someone else fails start() with StoreUnavailable and the log."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        proc = RedisProcess(squatter.getsockname()[1])
        with pytest.raises(StoreUnavailable, match="did not start"):
            proc.start()
        proc.stop()


def test_reachable_is_false_where_nothing_listens() -> None:
    """reachable() answers False (never raises) for a closed port."""
    assert not reachable(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
