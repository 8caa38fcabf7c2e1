"""run_job: plan, lease, fold, write once; busy, stale and lost-lease paths; no text in logs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import structlog

from shared.errors import LeaseLost
from shared.head import head_end
from shared.messages import Message
from shared.service import precompute
from shared.service.precompute import JobOutcome, run_job
from shared.settings import Settings
from shared.store import Store, keys
from shared.summaries.llm import Completion
from shared.summaries.summarizers import Summarizer
from tests.builders import task_chat
from tests.fakellm import FakeLLM
from tests.worker.helpers import (
    assert_disjoint,
    job_for,
    policy_of,
    summarized_range,
    worker_settings,
)
from worker.runtime import make_summarizer

pytestmark = pytest.mark.anyio


async def run_once(
    store: Store,
    settings: Settings,
    job: Any,
    *,
    summarizer: Summarizer | None = None,
    owner: str = "task-1/abc",
) -> JobOutcome:
    """Run one job on the test's event loop, closing the summarizer's HTTP client after."""
    s = summarizer if summarizer is not None else make_summarizer(settings)
    try:
        return await run_job(job, store=store, summarizer=s, settings=settings, owner=owner)
    finally:
        client = getattr(s, "client", None)
        if client is not None:
            await client.aclose()


@pytest.fixture
def settings(redis_url: str, fake: FakeLLM) -> Settings:
    return worker_settings(redis_url, fake)


async def test_writes_the_due_record_once(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A due record is written with SET NX, indexed, counted; a second run plans nothing."""
    msgs = task_chat(30)
    store.conversations.append(tenant, "c1", msgs)
    job = job_for(store, tenant, "c1", model)
    first = await run_once(store, settings, job)
    assert first.status == "written" and first.records == 1 and first.calls == len(fake.calls) == 1
    record = store.records.best(tenant, "c1")
    assert record is not None and record.upto == first.upto
    assert record.prefix_hash == first.prefix_hash
    assert (
        record.text.startswith("SUMMARY ")
        and record.summarizer == f"openai:{settings.summarizer_model}"
    )
    usage = store.usage.get(tenant)
    assert usage.summaries == 1
    assert usage.input_tokens + usage.output_tokens == first.tokens > 0
    assert store.leases.owner(tenant, "c1") is None  # released
    second = await run_once(store, settings, job)
    assert second.status == "not_due" and second.calls == 0 and len(fake.calls) == 1
    start, end = summarized_range(fake.calls[0], msgs)
    # the head stays; the first range starts after it
    assert start == head_end(msgs) and end == record.upto


async def test_not_due_under_the_threshold(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A short conversation needs no summary: no LLM call, no lease taken."""
    store.conversations.append(tenant, "c1", task_chat(4))
    out = await run_once(store, settings, job_for(store, tenant, "c1", model))
    assert out.status == "not_due" and out.calls == 0 and fake.calls == []
    assert store.records.list(tenant, "c1") == []


async def test_the_job_counts_with_its_own_tenants_ratio(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """Another tenant's calibration never makes a job due; the job's tenant's does."""
    store.conversations.append(tenant, "c1", task_chat(16))  # 1,946 base tokens: under 2,625
    store.ratios.observe(f"{tenant}-other", model, 1.5)
    assert (
        await run_once(store, settings, job_for(store, tenant, "c1", model))
    ).status == "not_due"
    store.ratios.observe(tenant, model, 1.5)
    assert (
        await run_once(store, settings, job_for(store, tenant, "c1", model))
    ).status == "written"


async def test_busy_while_another_worker_holds_the_lease(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A held lease makes the job end as busy, naming the holder, without calling the LLM."""
    store.conversations.append(tenant, "c1", task_chat(30))
    assert store.leases.acquire(tenant, "c1", "other-task/xyz", 30)
    out = await run_once(store, settings, job_for(store, tenant, "c1", model))
    assert out.status == "busy" and out.holder == "other-task/xyz"
    assert fake.calls == [] and store.records.list(tenant, "c1") == []
    assert store.leases.owner(tenant, "c1") == "other-task/xyz"  # not stolen, not released


async def test_replaced_transcript_is_planned_as_it_is_now(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A job whose prefix no longer matches plans on the current transcript and says so."""
    store.conversations.append(tenant, "c1", task_chat(30, tag="old"))
    job = job_for(store, tenant, "c1", model)
    now = task_chat(32, tag="new")
    store.conversations.replace(tenant, "c1", now)
    out = await run_once(store, settings, job)
    assert out.status == "written" and out.prefix_changed
    record = store.records.best(tenant, "c1")
    assert record is not None and record.upto == out.upto
    assert store.conversations.hashes(tenant, "c1")[record.upto] == record.prefix_hash
    assert summarized_range(fake.calls[0], now) == (head_end(now), record.upto)


async def test_deleted_conversation_is_a_stale_job(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A job for a conversation deleted meanwhile ends as stale_job and writes nothing."""
    store.conversations.append(tenant, "c1", task_chat(30))
    job = job_for(store, tenant, "c1", model)
    store.conversations.delete(tenant, "c1")
    out = await run_once(store, settings, job)
    assert out.status == "stale_job" and fake.calls == []
    assert not store.conversations.exists(tenant, "c1")


async def test_same_prefix_in_another_conversation_is_linked(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A record the tenant already has for the planned prefix is linked, not recomputed."""
    msgs = task_chat(30)
    store.conversations.append(tenant, "a", msgs)
    store.conversations.append(tenant, "b", msgs)
    first = await run_once(store, settings, job_for(store, tenant, "a", model))
    second = await run_once(store, settings, job_for(store, tenant, "b", model))
    assert first.status == "written" and second.status == "exists" and second.calls == 0
    assert len(fake.calls) == 1
    assert store.records.best(tenant, "b") == store.records.best(tenant, "a")


class Thief:
    """A summarizer during whose call another worker takes the lease over."""

    name = "thief"

    def __init__(self, store: Store, tenant: str, conv_id: str, wait: float) -> None:
        self.store, self.tenant, self.conv_id, self.wait = store, tenant, conv_id, wait

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        self.store.client.set(keys.conv_lease(self.tenant, self.conv_id), "other/zzz")
        await asyncio.sleep(self.wait)  # long enough for a renewal to be refused
        return Completion("a summary", input_tokens=100, output_tokens=10, cost=0.5)


async def test_lost_lease_writes_nothing(
    store: Store, redis_url: str, fake: FakeLLM, tenant: str, model: str
) -> None:
    """A worker whose lease passed to another writes no record (what it spent is counted)."""
    settings = worker_settings(redis_url, fake, lease_ttl_s=0.3)
    store.conversations.append(tenant, "c1", task_chat(30))
    thief = Thief(store, tenant, "c1", wait=0.5)
    with pytest.raises(LeaseLost):
        await run_once(store, settings, job_for(store, tenant, "c1", model), summarizer=thief)
    assert store.records.list(tenant, "c1") == []
    assert store.leases.owner(tenant, "c1") == "other/zzz"  # the new holder keeps it
    usage = store.usage.get(tenant)
    assert (usage.summaries, usage.input_tokens, usage.cost) == (1, 100, 0.5)  # made, paid


class Growing:
    """Forwards to a real summarizer; on its first call the conversation grows by `more`."""

    def __init__(self, inner: Summarizer, store: Store, tenant: str, more: list[Message]) -> None:
        self.inner, self.store, self.tenant, self.more = inner, store, tenant, more
        self.name = inner.name
        self.client = getattr(inner, "client", None)

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        if self.more:
            self.store.conversations.append(self.tenant, "c1", self.more)
            self.more = []
        return await self.inner.summarize(previous, messages, max_tokens=max_tokens)


async def test_holder_covers_what_became_due_while_it_worked(
    store: Store, settings: Settings, fake: FakeLLM, tenant: str, model: str
) -> None:
    """Turns appended during a summary get the next record from the same job, folded in."""
    msgs = task_chat(60)
    store.conversations.append(tenant, "c1", msgs[:32])
    job = job_for(store, tenant, "c1", model)
    growing = Growing(make_summarizer(settings), store, tenant, msgs[32:])
    out = await run_once(store, settings, job, summarizer=growing)
    assert out.status == "written" and out.records == 2 and out.calls == 2
    ranges = [summarized_range(c, msgs) for c in fake.calls]
    assert_disjoint(ranges)
    # the second continues the first
    assert ranges[0][0] == head_end(msgs) and ranges[1][0] == ranges[0][1]
    first_text = fake.answer(fake.calls[0].prompt)
    assert f"<previous_summary>\n{first_text}\n</previous_summary>" in fake.calls[1].prompt
    best = store.records.best(tenant, "c1")
    assert best is not None and best.upto == ranges[1][1] == out.upto
    # and nothing more is due now
    state = store.conversations.snapshot(tenant, "c1")
    policy = policy_of(store, settings, job)
    assert (
        policy.plan_summary(state.messages, model=model, book=store.records.book(tenant, "c1"))
        is None
    )


def captured_debug(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What precompute logs from now on, DEBUG included, whatever structlog's configuration
    (a `prefit` command run earlier in this process set INFO and cached its loggers)."""
    capture = structlog.testing.LogCapture()
    logger = structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.make_filtering_bound_logger(0)
    )
    monkeypatch.setattr(precompute, "log", logger)
    return capture.entries


async def test_logs_carry_ids_never_message_text(
    store: Store,
    settings: Settings,
    fake: FakeLLM,
    tenant: str,
    model: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What run_job logs names ids, hashes and counts, never a word of the conversation."""
    msgs = task_chat(30, tag="SECRETWORD")
    store.conversations.append(tenant, "c1", msgs)
    logs = captured_debug(monkeypatch)
    out = await run_once(store, settings, job_for(store, tenant, "c1", model))
    assert out.status == "written"
    events = {e["event"] for e in logs}
    assert "summary.computed" in events
    computed = next(e for e in logs if e["event"] == "summary.computed")
    assert computed["conversation_id"] == "c1" and computed["upto"] == out.upto
    dumped = repr(logs)
    assert "SECRETWORD" not in dumped and "lorem" not in dumped and "SUMMARY" not in dumped
