"""Real worker processes for fault tests: the production command line, configured by environment."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from shared.commands.up import worker_argv
from shared.settings import Settings
from tests.conftest import ROOT
from tests.worker.helpers import SUMMARIZER_MODEL


def worker_env(settings: Settings, concurrency: int) -> dict[str, str]:
    """The environment that makes `celery -A worker.app worker` run with `settings`."""
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "PREFIT_REDIS_CLUSTER": "true" if settings.redis_cluster else "false",
        "PREFIT_BROKER_URL": settings.broker,
        "PREFIT_SUMMARIZER_URL": settings.summarizer_url or "",
        "PREFIT_SUMMARIZER_MODEL": SUMMARIZER_MODEL,
        "PREFIT_SUMMARY_QUEUE": settings.summary_queue,
        "PREFIT_VISIBILITY_TIMEOUT_S": str(settings.visibility_timeout_s),
        "PREFIT_LEASE_TTL_S": str(settings.lease_ttl_s),
        "PREFIT_MAX_REDELIVERIES": str(settings.max_redeliveries),
        "PREFIT_WORKER_CONCURRENCY": str(concurrency),
        "PREFIT_LOG_JSON": "true",
    }
    env.pop("PREFIT_BROKER_URL", None)  # the store's Redis unless the settings name a broker
    if settings.broker_url is not None:
        env["PREFIT_BROKER_URL"] = settings.broker_url
    return env


def start_worker_process(
    settings: Settings,
    name: str,
    log: Path,
    *,
    concurrency: int = 4,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`celery -A worker.app worker` as a child process (the production command line)."""
    cmd = [
        *worker_argv(settings, concurrency),
        *("-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-l", "INFO"),
    ]
    full_env = {**worker_env(settings, concurrency), **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)


def end(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker process we started: SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
