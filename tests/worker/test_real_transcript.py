"""A real conversation, appended turn by turn as the API would: its summaries are ready in time."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from shared.settings import Settings
from shared.store import Store
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts
from tests.fakellm import FakeLLM
from tests.worker.helpers import (
    assert_disjoint,
    enqueue,
    job_for,
    policy_of,
    running_worker,
    summarized_range,
    worker_settings,
)

pytestmark = pytest.mark.anyio

# 132 messages, ~46k tokens, no single message over 11k characters
NAME = "mswea_gemini3pro__django__django-13933.json"
WINDOW, RESERVE, CHUNK = 34000, 2000, 8000


@pytest.mark.slow
@needs_transcripts
async def test_records_are_computed_ahead_of_the_trigger_and_used(
    store: Store,
    redis_url: str,
    fake: FakeLLM,
    tenant: str,
    model: str,
    app_for: Callable[[Settings], Any],
) -> None:
    """Jobs enqueued while nearing give prepare its records before the trigger; no range twice."""
    msgs = load_transcript(TRANSCRIPTS / NAME)["messages"]
    settings = worker_settings(redis_url, fake, chunk_tokens=CHUNK)
    app = app_for(settings)
    steps = []
    with running_worker(app, concurrency=4) as runs:
        for k in range(1, len(msgs) + 1):
            steps.append(await _turn(store, settings, app, runs, tenant, model, msgs, k))
    written = [s["job"] for s in steps if s["job"] and s["job"]["status"] == "written"]
    records = store.records.list(tenant, "c1")
    assert len(written) == len(records) >= 2  # the cut advanced in steps

    # The LLM saw every summarized message once: disjoint ranges, contiguous from the head.
    ranges = [summarized_range(c, msgs) for c in fake.calls]
    assert_disjoint(ranges)
    assert ranges[0][0] == 2 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert {r.upto for r in records} <= {end for _, end in ranges}
    assert sum(j["calls"] for j in written) == len(fake.calls)

    # Records were there before the trigger: the first prompt over it already had one ...
    first_over = next(s for s in steps if s["raw"] > s["trigger"])
    assert first_over["records_before"] >= 1
    # ... and, but for a single message jumping the whole precompute band, the prompt built
    # from the best record never reached the trigger and prepare never served a stale cut.
    band = settings.precompute_at * (WINDOW - RESERVE)
    checked = [s for s in steps if s["growth"] < band]
    assert len(checked) >= len(steps) - 3
    for s in checked:
        assert s["effective"] <= s["trigger"] and not s["stale"], s
    used = sorted({s["summary_upto"] for s in steps if s["summary_upto"] is not None})
    assert used and set(used) <= {r.upto for r in records}
    print(
        f"records upto {sorted(r.upto for r in records)}, prepare used {used}, "
        f"{len(fake.calls)} LLM calls for ranges {ranges}"
    )


async def _turn(
    store: Store,
    settings: Settings,
    app: Any,
    runs: Any,
    tenant: str,
    model: str,
    msgs: list[dict[str, Any]],
    k: int,
) -> dict[str, Any]:
    """Append message k-1, prepare with the stored book, then enqueue (and await) a job if due."""
    store.conversations.append(tenant, "c1", [msgs[k - 1]])
    job = job_for(store, tenant, "c1", model, window=WINDOW, reserve=RESERVE)
    policy = policy_of(store, settings, job)
    book = store.records.book(tenant, "c1")
    transcript = msgs[:k]
    effective = policy.effective_tokens(transcript, model=model, book=book)
    report = (await policy.prepare(transcript, model=model, book=book)).report or {}
    step: dict[str, Any] = {
        "k": k,
        "effective": effective,
        "growth": policy.counter.count_message(msgs[k - 1], model),
        "raw": report["tokens_before"],
        "trigger": report["trigger_tokens"],
        "stale": report["stale"],
        "summary_upto": (report["summary"] or {}).get("upto"),
        "records_before": len(book.records),
        "job": None,
    }
    if policy.state(effective, model) != "under":
        (step["job"],) = runs.wait([enqueue(app, settings, job)])
    return step
