"""Failing providers under a stream of stale triggers: a breaker, one dead letter, no call storm."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from shared.service.jobs import PRIORITY_STALE
from shared.settings import Settings
from shared.store import Store
from shared.store.breaker import provider_id
from tests.builders import task_chat
from tests.fakellm import Failure, FakeLLM
from tests.worker.helpers import TaskRuns, enqueue, job_for, running_worker, worker_settings

AppFor = Callable[..., Any]
CONVERSATIONS = ("c1", "c2", "c3")


def trigger(
    app: Any, settings: Settings, store: Store, tenant: str, model: str, *, n: int, every_s: float
) -> list[str]:
    """`n` stale prepares, `every_s` apart, cycling over the conversations: as if each one's
    marker had expired (the API re-enqueues a stale conversation every 15 s)."""
    ids = []
    for i in range(n):
        job = job_for(store, tenant, CONVERSATIONS[i % len(CONVERSATIONS)], model)
        ids.append(enqueue(app, settings, job, PRIORITY_STALE))
        time.sleep(every_s)
    return ids


def _statuses(runs: TaskRuns, ids: list[str], timeout: float = 30.0) -> Counter[str]:
    return Counter(o["status"] for o in runs.wait(ids, timeout))


def _conversations(store: Store, tenant: str, **kw: Any) -> None:
    for conv in CONVERSATIONS:
        store.conversations.append(tenant, conv, task_chat(30, tag=conv, **kw))


FAULTS: dict[str, Callable[[FakeLLM], None]] = {
    "401": lambda fake: fake.script(*[Failure(401)] * 100),
    "malformed_json": lambda fake: fake.script(*[Failure(200, body="<html>oops</html>")] * 100),
    # every prompt is "too long", down to a single small turn group: the configuration is wrong
    "context_length": lambda fake: setattr(fake, "context_limit_chars", 50),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_permanent_fault_is_called_once_per_breaker_period(
    fault: str,
    store: Store,
    redis_url: str,
    fake: FakeLLM,
    tenant: str,
    model: str,
    app_for: AppFor,
) -> None:
    """30 stale triggers over 3 s on 3 conversations: once the breaker is open (the default
    pause: 60 s) jobs end without calling; one dead letter per conversation at most."""
    settings = worker_settings(redis_url, fake)
    FAULTS[fault](fake)
    _conversations(store, tenant)
    app = app_for(settings)
    with running_worker(app) as runs:
        ids = trigger(app, settings, store, tenant, model, n=30, every_s=0.1)
        statuses = _statuses(runs, ids)
    letters = store.dead_letters.list(tenant)
    assert runs.retried == []
    assert set(statuses) <= {"dead_letter", "breaker_open", "blocked", "busy"}
    assert statuses["dead_letter"] == len(letters) >= 1
    assert max(Counter(letter.conv_id for letter in letters).values()) == 1
    # the dead-lettered conversations' later jobs end on their block, the others' on the breaker
    assert statuses["breaker_open"] + statuses["blocked"] >= 25
    assert fake.calls and all(c.at <= max(x.at for x in letters) for c in fake.calls)
    if fault != "context_length":  # that one halves the chunk down to one turn group first,
        # while other jobs may start calling. Jobs of other conversations already calling when
        # the first failure came back fail too (one each, dead-lettered); none calls after it
        assert len(fake.calls) == len(letters) <= 3
    breaker = store.breakers.state(str(provider_id(settings)))
    assert breaker.state == "open" and breaker.failures == 1
    assert store.records.list(tenant, "c1") == []


@pytest.mark.slow
def test_the_pause_doubles_and_a_good_probe_closes_the_breaker(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """Pauses of 0.5 s then 1 s between calls (one probe each); the third probe succeeds and
    summaries resume."""
    settings = worker_settings(redis_url, fake, breaker_backoff_s=0.5, breaker_backoff_max_s=4)
    fake.script(Failure(401), Failure(401))  # then it answers
    _conversations(store, tenant)
    app = app_for(settings)
    with running_worker(app) as runs:
        ids = trigger(app, settings, store, tenant, model, n=40, every_s=0.1)
        statuses = _statuses(runs, ids)
    first, second, probe = fake.calls[:3]
    assert [first.status, second.status, probe.status] == [401, 401, 200]
    assert second.at - first.at >= 0.5 and probe.at - second.at >= 1.0
    assert statuses["dead_letter"] == 2 and statuses["written"] >= 1
    assert store.breakers.state(str(provider_id(settings))).state == "closed"
    assert len(store.dead_letters.list(tenant)) == 2


@pytest.mark.slow
def test_a_hung_provider_ends_in_exactly_one_dead_letter(
    store: Store, redis_url: str, tenant: str, model: str, app_for: AppFor
) -> None:
    """Every call times out: the range's budget (3 attempts) is spent across retries and new
    jobs alike, then one dead letter; the other jobs and retries end blocked without calling."""
    with FakeLLM(delay=30.0) as fake:
        settings = worker_settings(
            redis_url,
            fake,
            summarizer_timeout_s=0.3,
            summarizer_max_attempts=1,
            max_redeliveries=2,
        )
        store.conversations.append(tenant, "c1", task_chat(30))
        app = app_for(settings)
        with running_worker(app) as runs:
            ids = [enqueue(app, settings, job_for(store, tenant, "c1", model), PRIORITY_STALE)]
            for _ in range(9):  # prepares keep finding it stale meanwhile
                time.sleep(0.2)
                ids.append(enqueue(app, settings, job_for(store, tenant, "c1", model)))
            statuses = _statuses(runs, ids, timeout=60.0)
        calls = len(fake.calls)
    assert calls == 3  # max_redeliveries + 1 timed-out attempts, whoever made them
    assert statuses["dead_letter"] == 1
    assert set(statuses) <= {"dead_letter", "blocked", "busy"}
    (letter,) = store.dead_letters.list(tenant)
    assert letter.attempts == 3 and "RetryableLLMError" in letter.error
    block = store.blocks.get(tenant, "c1")
    assert block is not None and block.range.origin == "none"


def test_a_range_too_long_for_the_summarizer_blocks_that_conversation_only(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str, app_for: AppFor
) -> None:
    """One tenant's turn group too long to summarize: its range is dead-lettered and blocked,
    the breaker stays closed, and another tenant's conversation is summarized as usual."""
    # no artifact index in the prompts: it would blur the line between the sizes below
    settings = worker_settings(redis_url, fake, chunk_tokens=1000, index_share=0.0)
    # refused: the turn group of the 20k-character message (clipped to 6k in prompts), not
    # the others (one ~700-token group per chunk)
    fake.context_limit_chars = 6500
    huge = task_chat(40, tag="big", size=1200)
    huge[5] = {"role": "user", "content": "x" * 20_000}
    store.conversations.append(tenant, "big", huge)
    other = f"{tenant}-b"
    store.conversations.append(other, "ok", task_chat(56, tag="ok", size=1200))
    app = app_for(settings)
    window = {"window": 20_000, "reserve": 500}
    with running_worker(app) as runs:
        bad = enqueue(app, settings, job_for(store, tenant, "big", model, **window))
        (outcome,) = runs.wait([bad])
        good = enqueue(app, settings, job_for(store, other, "ok", model, **window))
        again = enqueue(app, settings, job_for(store, tenant, "big", model, **window))
        (written, blocked) = runs.wait([good, again])
    assert outcome["status"] == "dead_letter" and "RangeTooLong" in outcome["error"]
    assert written["status"] == "written" and blocked["status"] == "blocked"
    assert store.breakers.state(str(provider_id(settings))).state == "closed"
    assert store.dead_letters.list(other) == [] and len(store.dead_letters.list(tenant)) == 1
