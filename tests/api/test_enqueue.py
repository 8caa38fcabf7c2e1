"""Enqueueing summary jobs: by name on the broker's priority lists, deduplicated, fail-safe."""

from __future__ import annotations

import time

import redis

from api.enqueue import CeleryEnqueue, SummaryTrigger, marker_for, size_step
from shared import keys
from shared.jobs import PRIORITY_AHEAD, PRIORITY_STALE, SummaryJob
from shared.redisproc import free_port
from shared.settings import Settings
from shared.store import Range, Store
from shared.summaries import SummaryRecord
from tests.api.conftest import Recorder


def job(tenant: str, conv: str = "c1") -> SummaryJob:
    return SummaryJob(tenant, conv, "m", 10_000, 1_000, 4, "v1:" + "ab" * 16)


def test_celery_enqueue_lands_on_the_priority_lists(settings: Settings, tenant: str) -> None:
    """send_task by name puts ahead and stale jobs on the worker queue's priority lists."""
    enqueue = CeleryEnqueue(settings)
    try:
        enqueue(job(tenant), PRIORITY_AHEAD)
        enqueue(job(tenant), PRIORITY_STALE)
    finally:
        enqueue.close()
    client = redis.Redis.from_url(settings.broker)
    lists = keys.broker_queues(settings.summary_queue)
    sizes = {i: client.llen(k) for i, k in enumerate(lists)}
    assert sizes[PRIORITY_AHEAD] == 1 and sizes[PRIORITY_STALE] == 1 and sum(sizes.values()) == 2
    client.delete(*lists)


def test_celery_enqueue_fails_fast_without_a_broker(tenant: str) -> None:
    """No broker: StoreUnavailable within a second or two, not a hang."""
    settings = Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    enqueue = CeleryEnqueue(settings)
    started = time.monotonic()
    try:
        enqueue(job(tenant), PRIORITY_AHEAD)
    except Exception as exc:
        assert type(exc).__name__ == "StoreUnavailable"
    else:
        raise AssertionError("expected StoreUnavailable")
    assert time.monotonic() - started < 5


def test_trigger_claims_once_per_state(store: Store, tenant: str) -> None:
    """One claim per (conversation, kind, record in use, size step); each is a new state."""
    recorder = Recorder()
    claimed: list[str] = []
    trigger = SummaryTrigger(store, recorder, on_claimed=claimed.append)
    first = trigger.claim(job(tenant), "ahead", None, step=40)
    assert first is not None and trigger.claim(job(tenant), "ahead", None, step=40) is None
    assert trigger.claim(job(tenant), "stale", None, step=40) is not None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert trigger.claim(job(tenant), "ahead", record, step=40) is not None
    assert trigger.claim(job(tenant), "ahead", record, step=41) is not None
    assert claimed == ["ahead", "stale", "ahead", "ahead"]
    assert trigger.send(first) is True and recorder.jobs == [(job(tenant), PRIORITY_AHEAD)]


def test_failed_send_frees_the_claim(store: Store, tenant: str) -> None:
    """A send the broker refuses clears its marker, so the next trigger claims again."""
    recorder = Recorder(fail=True)
    sent: list[tuple[str, bool]] = []
    trigger = SummaryTrigger(store, recorder, on_sent=lambda kind, ok: sent.append((kind, ok)))
    claim = trigger.claim(job(tenant), "ahead", None, step=1)
    assert claim is not None and trigger.send(claim) is False
    assert sent == [("ahead", False)]
    assert trigger.claim(job(tenant), "ahead", None, step=1) is not None


def test_size_steps_are_five_percent_of_the_budget() -> None:
    """A conversation's size state changes every 5% of the budget."""
    assert [size_step(t, 100_000) for t in (0, 4_999, 5_000, 75_000)] == [0, 0, 1, 15]
    assert marker_for("stale", None, 37) == "stale-none-37"


def test_no_job_is_claimed_for_a_conversation_whose_summary_was_dead_lettered(
    store: Store, tenant: str
) -> None:
    """While its range is blocked, stale prepares of the same state enqueue nothing; a record
    written since (another origin) or another conversation still gets its job."""
    rng = Range("none", 3, "v1:" + "ef" * 16)
    store.blocks.fail(tenant, "c1", rng, "LLMError: HTTP 401", limit=5, permanent=True)
    trigger = SummaryTrigger(store, Recorder())
    for step in (40, 41, 42):  # growing, re-triggered: still the same origin
        assert trigger.claim(job(tenant), "stale", None, step=step) is None
    assert trigger.claim(job(tenant), "ahead", None, step=40) is None
    record = SummaryRecord(3, "v1:" + "cd" * 16, "s")
    assert trigger.claim(job(tenant), "stale", record, step=40) is not None
    assert trigger.claim(job(tenant, "c2"), "stale", None, step=40) is not None
