"""Shared fixtures: real transcripts, offline tiktoken, a Redis of the suite's own."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.head import head_end
from shared.messages import Message, groups
from tests.redisbackend import FakeRedisServer, backend, describe

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TRANSCRIPTS = SHARED / "transcripts"
TIKTOKEN_DIR = SHARED / "tiktoken"

if (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file():
    # offline encodings for every Settings() the suite builds (no network at test time)
    os.environ.setdefault("PREFIT_TIKTOKEN_DIR", str(TIKTOKEN_DIR))


def transcript_files() -> list[Path]:
    """Every real transcript beside the repository (empty when ../shared is absent)."""
    return sorted(TRANSCRIPTS.glob("*.json")) if TRANSCRIPTS.is_dir() else []


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
    not transcript_files(),
    reason="../shared/transcripts is absent (a fresh clone): real-data tests skipped",
)
needs_tiktoken = pytest.mark.skipif(
    not (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file(),
    reason="../shared/tiktoken is absent: exact-count tests need its offline encodings",
)


@pytest.fixture(scope="session")
def tiktoken_dir() -> Path:
    if not (TIKTOKEN_DIR / "o200k_base.tiktoken").is_file():
        pytest.skip("../shared/tiktoken is absent: exact-count tests need its offline encodings")
    return TIKTOKEN_DIR


def pytest_report_header() -> str:
    """Which Redis this run uses: REDIS_URL, a throwaway redis-server, or fakeredis."""
    return describe()


@pytest.fixture(scope="session", autouse=True)
def cluster_backend() -> Iterator[str | None]:
    """On the cluster backend, the cluster's URL, with the session's environment in cluster
    mode (PREFIT_REDIS_CLUSTER, and PREFIT_BROKER_URL on a throwaway redis-server) before any
    test builds its `Settings`; None (and nothing started) on the others."""
    if backend().kind != "cluster":
        yield None
        return
    from shared.clusterproc import ClusterProcess
    from shared.redisproc import RedisProcess

    with ClusterProcess() as cluster, RedisProcess() as broker:
        mode = {"PREFIT_REDIS_CLUSTER": "true", "PREFIT_BROKER_URL": broker.url}
        saved = {name: os.environ.get(name) for name in mode}
        os.environ.update(mode)
        try:
            yield cluster.url
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="session")
def redis_url(cluster_backend: str | None) -> Iterator[str]:
    """A URL of the Redis `tests.redisbackend` chose: REDIS_URL, a throwaway redis-server of
    our own, fakeredis over TCP (a machine without Redis), or a node of a throwaway cluster.

    Tests never flush: they write under a unique tenant (see `tenant`).
    """
    from shared.redisproc import RedisProcess

    chosen = backend()
    if cluster_backend is not None:
        yield cluster_backend
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


@pytest.fixture
def tenant() -> str:
    """A tenant name no other test uses, so tests share a Redis without touching each other."""
    return f"t-{uuid.uuid4().hex[:12]}"
