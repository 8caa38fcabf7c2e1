"""Shared fixtures: real transcripts, tiktoken's files, a Redis of the suite's own, its store."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from shared.head import head_end
from shared.messages import Message, groups
from shared.settings import Settings
from shared.store import Store
from tests import brokerbackend
from tests.redisbackend import FakeRedisServer, backend, describe, require_cluster

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
# the few transcripts a clone carries (see NOTICE); all of them when ../shared is beside it
REPO_TRANSCRIPTS = ROOT / "transcripts"
TRANSCRIPTS = SHARED / "transcripts" if (SHARED / "transcripts").is_dir() else REPO_TRANSCRIPTS
TIKTOKEN_DIR = SHARED / "tiktoken"
RETENTION_S = 3600  # of the `settings` fixture's Redis keys

# CI: the same examples on every run, whatever ran before (no example database), and a
# failure printed with the `@reproduce_failure` line that replays it anywhere (README, Tests)
hypothesis.settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis.settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
)

if (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file():
    # offline encodings for every Settings() the suite builds (no network at test time)
    os.environ.setdefault("PREFIT_TIKTOKEN_DIR", str(TIKTOKEN_DIR))


def transcript_files() -> list[Path]:
    """Every real transcript: ../shared's when it is beside the repository, else the
    repository's own (`transcripts/`), so a fresh clone runs the real-data tests too."""
    return sorted(TRANSCRIPTS.glob("*.json"))


def load_transcript(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def long_session(target: int = 1000) -> list[Message]:
    """One long agent session: the real coding-agent transcripts, one task after another."""
    files = sorted(
        (p for p in transcript_files() if p.name.startswith("mswea")), key=lambda p: p.name
    )
    out: list[Message] = []
    for path in files:
        msgs = load_transcript(path)["messages"]
        out.extend(msgs if not out else msgs[head_end(msgs, keep_first_user=False) :])
        if len(out) >= target:
            break
    cut = max(b for _, b in groups(out) if b <= target)
    return out[:cut]


needs_transcripts = pytest.mark.skipif(
    not transcript_files(), reason=f"no transcripts in {TRANSCRIPTS}: real-data tests skipped"
)


@pytest.fixture(scope="session")
def tiktoken_dir(request: pytest.FixtureRequest) -> Path:
    """A folder of tiktoken's encoding files: ../shared/tiktoken (offline), else the files
    `prefit encodings` downloads (SHA-256 checked) into pytest's cache; the test skips only
    when there are no offline files and the encodings cannot be downloaded."""
    if (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file():
        return TIKTOKEN_DIR
    from shared.commands.encodingfiles import install_encodings
    from shared.errors import ConfigError

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    into = cache.mkdir("tiktoken") if cache is not None else factory.mktemp("tiktoken")
    try:
        install_encodings(into)
    except ConfigError:
        pytest.skip("../shared/tiktoken is absent and tiktoken cannot download its encodings")
    return Path(into)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="run the tests marked slow too (deselected by default): the whole suite",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked slow (drills, process spawns, long property runs), so that a
    plain `uv run pytest` is quick; `--slow`, a `-m` expression, or a slow test named by its
    node id runs them."""
    if config.getoption("--slow") or config.getoption("markexpr"):
        return
    here = config.invocation_params.dir
    named = [arg.partition("::") for arg in config.args if "::" in arg]

    def wanted(item: pytest.Item) -> bool:
        if item.get_closest_marker("slow") is None:
            return True
        name = item.nodeid.partition("::")[2]
        return any(
            (here / path).resolve() == item.path and (name == test or name.startswith(test + "["))
            for path, _, test in named
        )

    slow = [item for item in items if not wanted(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if wanted(item)]


def pytest_report_header() -> list[str]:
    """Which Redis this run uses (REDIS_URL, a throwaway redis-server, or fakeredis) and which
    broker the worker tests use (that Redis, or RabbitMQ)."""
    return [describe(), brokerbackend.describe()]


@dataclass(frozen=True)
class ClusterBackend:
    """The cluster backend's servers: the cluster (the store) and the Redis broker."""

    url: str
    broker_url: str


@pytest.fixture(scope="session", autouse=True)
def cluster_backend() -> Iterator[ClusterBackend | None]:
    """On the cluster backend, the cluster and a throwaway redis-server for the broker, with
    the session's environment in cluster mode (PREFIT_REDIS_CLUSTER, PREFIT_BROKER_URL) before
    any test builds its `Settings`; None (and nothing started) on the others."""
    if backend().kind != "cluster":
        yield None
        return
    from shared.commands.clusterproc import ClusterProcess
    from shared.commands.redisproc import RedisProcess

    with ClusterProcess() as cluster, RedisProcess() as broker:
        mode = {"PREFIT_REDIS_CLUSTER": "true", "PREFIT_BROKER_URL": broker.url}
        saved = {name: os.environ.get(name) for name in mode}
        os.environ.update(mode)
        try:
            yield ClusterBackend(cluster.url, broker.url)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="session")
def redis_url(cluster_backend: ClusterBackend | None) -> Iterator[str]:
    """A URL of the Redis `tests.redisbackend` chose: REDIS_URL, a throwaway redis-server of
    our own, fakeredis over TCP (a machine without Redis), or a node of a throwaway cluster.

    Tests never flush: they write under a unique tenant (see `tenant`).
    """
    from shared.commands.redisproc import RedisProcess

    chosen = backend()
    if cluster_backend is not None:
        yield cluster_backend.url
        return
    if chosen.url is not None:
        yield chosen.url
        return
    server = FakeRedisServer() if chosen.kind == "fakeredis" else RedisProcess()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cluster_url(cluster_backend: ClusterBackend | None) -> Iterator[str]:
    """A Redis Cluster node's URL: the session's cluster, else a throwaway cluster started once
    for the tests that need one whatever the backend (skipped on fakeredis)."""
    if cluster_backend is not None:
        yield cluster_backend.url
        return
    require_cluster()
    from shared.commands.clusterproc import ClusterProcess

    with ClusterProcess() as cluster:
        yield cluster.url


@pytest.fixture(scope="session")
def standalone_url(redis_url: str, cluster_backend: ClusterBackend | None) -> str:
    """A standalone Redis's URL: the session's, or the broker's beside the cluster."""
    if cluster_backend is not None:
        return cluster_backend.broker_url
    if backend().kind == "fakeredis":
        pytest.skip("the suite runs on fakeredis: it has no INFO cluster to check")
    return redis_url


@pytest.fixture(scope="session")
def redis_broker_url(redis_url: str, cluster_backend: ClusterBackend | None) -> str:
    """A Redis for the Celery broker: the store's, or a standalone one beside the cluster."""
    return cluster_backend.broker_url if cluster_backend is not None else redis_url


@pytest.fixture
def amqp_url() -> str:
    """RabbitMQ's URL for tests about RabbitMQ itself (this machine kind's, unless
    PREFIT_TEST_BROKER names another); the test skips when none answers."""
    _, url = brokerbackend.chosen()
    return brokerbackend.require(url or brokerbackend.LOCAL_AMQP)


@pytest.fixture(autouse=True)
def _forget_broker_queues() -> Iterator[None]:
    """Delete the RabbitMQ queues the test declared (nothing to do on Redis)."""
    yield
    brokerbackend.forget_queues()


@pytest.fixture
def tenant() -> str:
    """A tenant name no other test uses, so tests share a Redis without touching each other."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings() -> Settings:
    """Settings with the suite's retention; the API tests and some worker modules override it
    (the `store` is then built with theirs)."""
    return Settings(retention_s=RETENTION_S)


@pytest.fixture
def store(redis_url: str, settings: Settings) -> Iterator[Store]:
    """A store on the suite's Redis with the test's `settings`, closed after the test (never
    flushed: tests write under their own `tenant`)."""
    s = Store.from_url(redis_url, settings)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """The event loop of the async tests (`pytest.mark.anyio`): asyncio, as prefit serves on."""
    return "asyncio"
