"""DeadLetters: bounded, expiring, newest first."""

from __future__ import annotations

from shared.settings import Settings
from shared.store import DeadLetters, Store, keys
from shared.store.deadletters import MAX_ERROR_CHARS
from tests.conftest import RETENTION_S


def test_add_then_list_newest_first(store: Store, tenant: str) -> None:
    """Dead letters come back newest first with their fields."""
    store.dead_letters.add(tenant, "c1", "task-1", "LLMError: 500", 5)
    store.dead_letters.add(tenant, "c2", "task-2", "LeaseLost", 1)
    got = store.dead_letters.list(tenant)
    assert [(d.conv_id, d.task_id, d.error, d.attempts) for d in got] == [
        ("c2", "task-2", "LeaseLost", 1),
        ("c1", "task-1", "LLMError: 500", 5),
    ]
    assert [d.task_id for d in store.dead_letters.list(tenant, limit=1)] == ["task-2"]


def test_list_is_bounded_and_ttl_set(store: Store, tenant: str) -> None:
    """Only the newest max_entries are kept, and the list expires after the retention."""
    letters = DeadLetters(store.client, retention_s=RETENTION_S, max_entries=3)
    for i in range(5):
        letters.add(tenant, "c", f"task-{i}", "boom", 1)
    assert [d.task_id for d in letters.list(tenant)] == ["task-4", "task-3", "task-2"]
    assert 0 < store.client.pttl(keys.dead_letters(tenant)) <= RETENTION_S * 1000


def test_error_text_is_truncated(store: Store, tenant: str) -> None:
    """A huge error text is cut to MAX_ERROR_CHARS."""
    store.dead_letters.add(tenant, "c", "t", "x" * (MAX_ERROR_CHARS * 3), 2)
    assert len(store.dead_letters.list(tenant)[0].error) == MAX_ERROR_CHARS


def test_empty_and_other_tenants(store: Store, tenant: str) -> None:
    """A tenant without dead letters lists none, even when another tenant has some."""
    store.dead_letters.add(tenant, "c", "t", "e", 1)
    assert store.dead_letters.list(tenant + "-b") == []
    assert store.dead_letters.list(tenant, limit=0) == []


def test_store_keeps_settings_dead_letters_max(redis_url: str, tenant: str) -> None:
    """`Store.from_url` bounds each tenant's dead letters by `Settings.dead_letters_max`."""
    store = Store.from_url(redis_url, Settings(retention_s=RETENTION_S, dead_letters_max=2))
    try:
        for i in range(4):
            store.dead_letters.add(tenant, "c", f"task-{i}", "boom", 1)
        assert [d.task_id for d in store.dead_letters.list(tenant)] == ["task-3", "task-2"]
    finally:
        store.close()
