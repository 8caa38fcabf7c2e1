"""Redis killed and restarted under load, five times: the worker rides it out, still summarizing."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from pathlib import Path

import pytest

from shared.commands.redisproc import RedisProcess
from shared.service.jobs import PRIORITY_AHEAD, PRIORITY_STALE
from shared.settings import Settings
from shared.store import Store
from tests.brokerbackend import chosen
from tests.builders import task_chat
from tests.redisbackend import needs_redis_server
from tests.worker.helpers import enqueue, job_for, model_name, wait_until, worker_settings
from tests.worker.processes import end, start_worker_process
from worker.app import make_app

RESTARTS = 5
DOWN_S = 6.0  # as the operator's drill: kill -9, wait 6 s, start again on the same port and AOF
PAUSE_S = 0.02  # between one client's jobs: steady traffic the worker keeps up with


class Traffic:
    """Client threads that keep adding conversations and enqueueing their jobs, faults or not."""

    def __init__(self, store: Store, settings: Settings, tenant: str, threads: int = 3) -> None:
        self.store, self.settings, self.tenant = store, settings, tenant
        self.app = make_app(settings)
        self.model = model_name()
        self.sent = 0
        self.failed = 0
        self.probes: set[str] = set()
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self.app.close()

    def summarize_now(self, conv_id: str, priority: int = PRIORITY_AHEAD) -> None:
        """A conversation due for a summary, and its job (raises while Redis is down)."""
        self.store.conversations.append(self.tenant, conv_id, task_chat(30, tag=conv_id))
        job = job_for(self.store, self.tenant, conv_id, self.model)
        enqueue(self.app, self.settings, job, priority)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.summarize_now(f"load-{next(self._ids)}")
                self.sent += 1
                self._stop.wait(PAUSE_S)
            except Exception:  # Redis is down (store or broker errors): keep trying
                self.failed += 1
                self._stop.wait(0.2)


@pytest.mark.slow
@needs_redis_server
@pytest.mark.skipif(
    chosen()[0] == "amqp", reason="a drill of the Redis broker (PREFIT_TEST_BROKER=amqp)"
)
def test_worker_survives_redis_restarts_under_load(tmp_path: Path, tenant: str) -> None:
    """Five kill -9 / restart cycles of Redis under traffic: same worker, summaries still made."""
    redis = RedisProcess(appendonly=True).start()
    settings = worker_settings(redis.url, None, summary_queue=f"drill-{uuid.uuid4().hex[:8]}")
    store = Store.from_url(redis.url, settings)
    worker = start_worker_process(settings, "drill", tmp_path / "worker.log", concurrency=200)
    try:
        with Traffic(store, settings, tenant) as traffic:
            for cycle in range(RESTARTS):
                # the worker is connected and consuming before each kill
                probe = f"probe-{cycle}"
                wait_until(lambda p=probe: _summarized(traffic, p), 60, f"{probe} summarized")
                redis.kill()
                time.sleep(DOWN_S)
                redis.restart()
                assert worker.poll() is None, _tail(tmp_path / "worker.log")
            # a conversation that became due after the last restart gets its record
            wait_until(lambda: _summarized(traffic, "after"), 60, "a summary after the drill")
        assert traffic.sent > 100 and traffic.failed > 0  # real traffic, and real outages
    finally:
        end(worker)
        store.close()
        redis.stop()
    log = (tmp_path / "worker.log").read_text()
    assert worker.returncode == 0, _tail(tmp_path / "worker.log")  # our SIGTERM, a clean stop
    assert "Unrecoverable error" not in log


def _summarized(traffic: Traffic, conv_id: str) -> bool:
    """Enqueue `conv_id` once it can be (Redis may still be loading); True once it has a record."""
    try:  # Redis not answering yet: try again
        if conv_id not in traffic.probes:
            traffic.summarize_now(conv_id, PRIORITY_STALE)  # ahead of the traffic's backlog
            traffic.probes.add(conv_id)
        return traffic.store.records.best(traffic.tenant, conv_id) is not None
    except Exception:  # Redis loading or down: ask again
        return False


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
