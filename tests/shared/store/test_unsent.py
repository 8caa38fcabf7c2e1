"""Jobs the broker refused: one kept per conversation, listed until sent, never dropped by a
send that raced a newer refusal."""

from __future__ import annotations

import uuid

from shared.store import Store


def _kwargs(tenant: str, conv: str, length: int) -> dict[str, object]:
    return {"tenant": tenant, "conversation_id": conv, "length": length}


def test_the_latest_job_per_conversation_is_kept_until_sent(store: Store, tenant: str) -> None:
    """A second refusal replaces the first job (not a second entry); `sent` forgets it."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert store.unsent.keep(queue, _kwargs(tenant, "c1", 10), 6) is True
    assert store.unsent.keep(queue, _kwargs(tenant, "c1", 14), 6) is False
    assert store.unsent.keep(queue, _kwargs(tenant, "c2", 3), 0) is True
    due = store.unsent.due(queue, 10)
    assert [(j.conversation_id, j.kwargs["length"], j.priority) for j in due] == [
        ("c1", 14, 6),
        ("c2", 3, 0),
    ]
    for job in due:
        store.unsent.sent(queue, job)
    assert store.unsent.count(queue) == 0 and store.unsent.due(queue, 10) == []
    assert store.unsent.keep(queue, _kwargs(tenant, "c1", 16), 6) is True  # a new outage


def test_a_job_kept_while_the_older_one_was_sent_stays_listed(store: Store, tenant: str) -> None:
    """A refusal landing between a sweep's read and its `sent` is not forgotten with the job
    that was sent."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    store.unsent.keep(queue, _kwargs(tenant, "c1", 10), 6)
    (old,) = store.unsent.due(queue, 10)
    store.unsent.keep(queue, _kwargs(tenant, "c1", 12), 6)  # the API, meanwhile
    store.unsent.sent(queue, old)
    (newer,) = store.unsent.due(queue, 10)
    assert newer.kwargs["length"] == 12
