"""A worker process SIGKILLed mid-summary: the task comes back, one record, nothing half-written."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import pytest

from shared.service.broker import broker_kind
from shared.settings import Settings
from shared.store import Store
from shared.summaries.artifacts import narrative
from shared.summaries.book import SummaryRecord
from tests.builders import task_chat
from tests.fakellm import FakeLLM
from tests.worker.helpers import enqueue, job_for, wait_until, worker_settings
from tests.worker.processes import end, start_worker_process
from worker.app import make_app

COMPLETE = re.compile(r"SUMMARY [0-9a-f]{8} of \d+ chars")


class Reader(threading.Thread):
    """Polls `best()` like a prepare would, remembering every record it was served."""

    def __init__(self, store: Store, tenant: str, conv_id: str) -> None:
        super().__init__(daemon=True)
        self.store, self.tenant, self.conv_id = store, tenant, conv_id
        self.seen: list[SummaryRecord] = []
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.01):
            record = self.store.records.best(self.tenant, self.conv_id)
            self.reads += 1
            if record is not None:
                self.seen.append(record)


@pytest.mark.slow
def test_killed_worker_task_is_redelivered_and_written_once(
    store: Store, redis_url: str, tenant: str, model: str, tmp_path: Path
) -> None:
    """SIGKILL mid-summary: another worker gets the task, writes one complete record once."""
    with FakeLLM(delay=3.0) as fake:
        settings = worker_settings(redis_url, fake, visibility_timeout_s=5, lease_ttl_s=3.0)
        store.conversations.append(tenant, "c1", task_chat(30))
        job = job_for(store, tenant, "c1", model)
        reader = Reader(store, tenant, "c1")
        reader.start()
        first = start_worker_process(settings, "doomed", tmp_path / "a.log")
        second: subprocess.Popen[bytes] | None = None
        try:
            enqueue(make_app(settings), settings, job)
            wait_until(lambda: len(fake.calls) == 1, 30, "the first worker to call the LLM")
            first.kill()  # SIGKILL while the fake still holds its request
            first.wait()
            second = start_worker_process(settings, "rescuer", tmp_path / "b.log")
            wait_until(lambda: store.records.best(tenant, "c1") is not None, 45, "the record")
            wait_until(lambda: bool(reader.seen), 5, "the reader to be served the record")
        finally:
            reader.stop.set()
            reader.join()
            end(first)
            if second is not None:
                end(second)
        rescuer_log = (tmp_path / "b.log").read_text()

    (record,) = store.records.list(tenant, "c1")
    assert len(fake.calls) == 2  # the killed worker's call, then the rescuer's
    assert store.usage.get(tenant).summaries == 1  # the killed worker's was never finished
    text = narrative(record.text)  # the artifact index follows the model's text
    assert text == fake.answer(fake.calls[1].prompt) and COMPLETE.fullmatch(text)
    assert reader.reads > 100 and reader.seen
    assert all(seen == record for seen in reader.seen)  # only ever the complete record
    assert "summary.task_redelivered" in rescuer_log and '"status": "written"' in rescuer_log
    assert store.dead_letters.list(tenant) == []


@pytest.mark.slow
def test_a_job_lost_with_its_worker_runs_again_within_seconds(
    store: Store, redis_url: str, tenant: str, model: str, tmp_path: Path
) -> None:
    """SIGKILL mid-summary with the default lease, reaper period and one-hour visibility
    timeout: on Redis the other worker's reaper sends the job again once the short lease has
    expired; RabbitMQ hands it out again as soon as the dead worker's connection is gone. The
    record comes within 10 s of the kill (the old 30 s lease could not), written once."""
    with FakeLLM(delay=60.0) as fake:  # the doomed worker's call outlasts the test
        defaults = Settings()
        settings = worker_settings(
            redis_url, fake, lease_ttl_s=defaults.lease_ttl_s,
            reaper_interval_s=defaults.reaper_interval_s,
        )  # fmt: skip
        assert settings.visibility_timeout_s == 3600  # Redis would wait an hour
        reaper = {"PREFIT_REAPER_INTERVAL_S": str(settings.reaper_interval_s)}
        store.conversations.append(tenant, "c1", task_chat(30))
        first = start_worker_process(settings, "doomed", tmp_path / "a.log", env=reaper)
        second: subprocess.Popen[bytes] | None = None
        try:
            enqueue(make_app(settings), settings, job_for(store, tenant, "c1", model))
            wait_until(lambda: len(fake.calls) == 1, 30, "the first worker to call the LLM")
            second = start_worker_process(settings, "rescuer", tmp_path / "b.log", env=reaper)
            wait_until(lambda: "ready." in (tmp_path / "b.log").read_text(), 30, "the rescuer")
            fake.delay = 0.2  # the rescuer's call answers at once
            first.kill()  # SIGKILL while the fake still holds its request
            first.wait()
            wait_until(lambda: store.records.best(tenant, "c1") is not None, 10, "the record")
        finally:
            end(first)
            if second is not None:
                end(second)
        rescuer_log = (tmp_path / "b.log").read_text()

    (record,) = store.records.list(tenant, "c1")
    assert len(fake.calls) == 2 and narrative(record.text) == fake.answer(fake.calls[1].prompt)
    assert store.usage.get(tenant).summaries == 1
    if broker_kind(settings.broker) == "amqp":  # redelivered on connection loss
        assert "summary.task_redelivered" in rescuer_log
    else:  # the visibility timeout is an hour away: only the reaper can have sent it
        assert "summary.task_reaped" in rescuer_log
        assert "summary.task_redelivered" not in rescuer_log
    assert store.inflight.running(settings.summary_queue) == 0  # nothing left to send again
    assert store.dead_letters.list(tenant) == []
