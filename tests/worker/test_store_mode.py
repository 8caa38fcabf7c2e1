"""Start-up: a worker exits before taking a task when Redis's cluster mode is not
PREFIT_REDIS_CLUSTER's, and says which settings disagree."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from shared.settings import Settings
from tests.worker.helpers import worker_settings
from tests.worker.processes import end, start_worker_process


def _exits(settings: Settings, log: Path) -> str:
    """Run the production worker command line on `settings`; its output once it has exited."""
    proc = start_worker_process(settings, "mode", log)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        end(proc)
        pytest.fail(f"the worker kept running: {log.read_text()[-2000:]}")
    assert code != 0
    return log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("clustered", [False, True])
def test_a_worker_on_the_wrong_kind_of_redis_exits_naming_both_settings(
    clustered: bool, cluster_url: str, standalone_url: str, tmp_path: Path
) -> None:
    """A cluster node without PREFIT_REDIS_CLUSTER, or the setting on a standalone Redis."""
    queue = f"mode-{uuid.uuid4().hex[:8]}"
    url = standalone_url if clustered else cluster_url
    settings = worker_settings(
        url, None, redis_cluster=clustered, broker_url=standalone_url, summary_queue=queue
    )
    output = _exits(settings, tmp_path / "worker.log")
    assert "PREFIT_REDIS_CLUSTER" in output and "REDIS_URL" in output
    assert ("is not a Redis Cluster node" if clustered else "is a Redis Cluster node") in output
