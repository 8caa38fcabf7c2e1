"""Which Redis the suite runs on: REDIS_URL, a throwaway redis-server, or fakeredis over TCP.

`PREFIT_TEST_REDIS` chooses (a switch of the test suite, not a setting of prefit):
- unset: REDIS_URL when it is set and answers, else a throwaway redis-server when one is
  installed, else fakeredis (a laptop without Redis still runs the store, API and worker tests);
- `server`: a throwaway redis-server, and the session fails when none is installed (CI sets
  this, so a missing install never quietly turns into a run on fakeredis);
- `fakeredis`: fakeredis as if no redis-server were installed (tests that drive a redis-server
  process of their own skip), so CI can exercise the laptop path too;
- `cluster`: a throwaway 3-master Redis Cluster (shared/commands/clusterproc.py) as the store, and a
  throwaway redis-server as the Celery broker (kombu has no cluster transport): every
  `Settings` the session builds is in cluster mode (`PREFIT_REDIS_CLUSTER`, `PREFIT_BROKER_URL`
  are set for the session). Tests that drive a redis-server process of their own skip.

fakeredis serves real clients over TCP (`fakeredis.TcpFakeServer`): the store, the API and the
Celery broker connect to its URL exactly as they would to a server.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from shared.commands.clusterproc import find_redis_cli
from shared.commands.redisproc import find_redis_server, reachable
from shared.settings import Settings
from shared.store.client import Client, connect

Kind = Literal["url", "server", "fakeredis", "cluster"]
SWITCH = "PREFIT_TEST_REDIS"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Backend:
    """The Redis of this test session and why it was chosen."""

    kind: Kind
    why: str
    url: str | None = None  # only for `url`: the others start theirs in the `redis_url` fixture


@cache
def backend() -> Backend:
    """The session's choice, made once (the pytest header and the skip markers agree on it)."""
    switch = os.environ.get(SWITCH, "").strip().lower()
    if switch == "fakeredis":
        return Backend("fakeredis", f"{SWITCH}=fakeredis")
    if switch == "server":
        if find_redis_server() is None:
            raise pytest.UsageError(f"{SWITCH}=server but no redis-server is installed")
        return Backend("server", f"{SWITCH}=server")
    if switch == "cluster":
        if find_redis_cli(find_redis_server()) is None:
            raise pytest.UsageError(f"{SWITCH}=cluster needs redis-server and redis-cli installed")
        return Backend("cluster", f"{SWITCH}=cluster")
    if switch:
        raise pytest.UsageError(
            f"{SWITCH} must be 'server', 'fakeredis' or 'cluster', not {switch!r}"
        )
    settings = Settings()
    if "redis_url" in settings.model_fields_set and reachable(settings.redis_url):
        return Backend("url", "REDIS_URL is set and answers", settings.redis_url)
    if find_redis_server() is not None:
        return Backend("server", "redis-server is installed")
    return Backend("fakeredis", "no redis-server installed")


def store_client(url: str) -> Client:
    """A new client of the session's store at `url`: a cluster client on the cluster backend."""
    return connect(url, cluster=backend().kind == "cluster")


def async_store_client(url: str) -> redis.asyncio.Redis | AsyncRedisCluster:
    """`store_client`, on asyncio."""
    if backend().kind == "cluster":
        return AsyncRedisCluster.from_url(url)
    return redis.asyncio.Redis.from_url(url)


def describe() -> str:
    """One line for the pytest header."""
    chosen = backend()
    if chosen.kind == "url":
        return f"redis: REDIS_URL {chosen.url} ({chosen.why})"
    if chosen.kind == "server":
        return f"redis: a throwaway redis-server ({chosen.why})"
    if chosen.kind == "cluster":
        return (
            f"redis: a throwaway 3-master Redis Cluster, the broker on a throwaway redis-server "
            f"({chosen.why}); tests that drive a redis-server process of their own are skipped"
        )
    import fakeredis

    return (
        f"redis: fakeredis {fakeredis.__version__} over TCP ({chosen.why}); "
        "tests that drive a redis-server process of their own are skipped"
    )


def _no_server_reason() -> str | None:
    """Why a test cannot start a redis-server of its own here, or None when it can."""
    chosen = backend()
    if chosen.kind == "fakeredis":
        return (
            f"the suite runs on fakeredis ({chosen.why}): this test drives a redis-server "
            "process of its own (kill, restart, SIGSTOP or its configuration)"
        )
    if chosen.kind == "cluster":
        return (
            f"the suite runs on a Redis Cluster ({chosen.why}): this test drives a standalone "
            "redis-server process of its own (kill, restart, SIGSTOP or its configuration)"
        )
    if find_redis_server() is None:
        return "no redis-server installed: this test drives a redis-server process of its own"
    return None


def _no_cluster_reason() -> str | None:
    """Why a test cannot have a Redis Cluster here (its session's, or one of its own)."""
    chosen = backend()
    if chosen.kind == "cluster":
        return None
    if chosen.kind == "fakeredis":
        return f"the suite runs on fakeredis ({chosen.why}): no Redis Cluster to start"
    if find_redis_cli(find_redis_server()) is None:
        return "a throwaway Redis Cluster needs redis-server and redis-cli installed"
    return None


def require_cluster() -> None:
    """Skip the calling test or fixture when no Redis Cluster can be had."""
    reason = _no_cluster_reason()
    if reason is not None:
        pytest.skip(reason)


needs_redis_server = pytest.mark.skipif(
    _no_server_reason() is not None, reason=_no_server_reason() or ""
)


class FakeRedisServer:
    """fakeredis behind a loopback TCP port, served by a child process.

    A process of its own, not a thread of the suite's: tests that count this process's threads
    or load it with fifty client threads see only their own, as with a real server.
    """

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FakeRedisServer:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.redisbackend"],
            cwd=ROOT,
            stdin=subprocess.PIPE,  # closed when this process ends, however it ends
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # the child prints its port once it serves
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the fakeredis server did not start (it printed {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()  # the child sets no handler: SIGTERM ends it at once
        proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def serve() -> None:
    """The child of `FakeRedisServer`: serve fakeredis on a free port, print the port, and
    exit when the parent's end of stdin closes (a test run killed outright leaves no server)."""
    from fakeredis import TcpFakeServer

    class Server(TcpFakeServer):  # type: ignore[misc]
        # socketserver listens with a backlog of 5: fifty threads connecting at once would
        # overflow it, and a dropped SYN is retried after 1 s, past the store's connect timeout
        request_queue_size = 512

    server = Server(("127.0.0.1", 0))
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True).start()
    _add_sha1hex(f"redis://127.0.0.1:{port}/0", server.fake_server)
    print(port, flush=True)
    sys.stdin.read()


def _add_sha1hex(url: str, fake_server: object) -> None:
    """Give fakeredis's Lua `redis.sha1hex`, which real Redis has and fakeredis's EVAL lacks.

    shared/store/scripts.py chains conversation hashes with it inside a script. The Lua runtime
    is made on the first EVAL, so one trivial script creates it before the function is added.
    """
    client = redis.Redis.from_url(url)
    try:
        client.eval("return 1", 0)
    finally:
        client.close()
    lua = fake_server._lua_runtime  # type: ignore[attr-defined]
    table = lua.eval("redis")  # the runtime has no encoding: its names are bytes
    if table[b"sha1hex"] is None:  # a fakeredis that has it needs no help
        table[b"sha1hex"] = lambda data: hashlib.sha1(bytes(data)).hexdigest().encode()


def require_redis_server() -> None:
    """Skip the calling test or fixture when it cannot start a redis-server of its own."""
    reason = _no_server_reason()
    if reason is not None:
        pytest.skip(reason)


if __name__ == "__main__":
    serve()
