"""Summary tasks that gave up: what failed and how often, never what the conversation said."""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from shared.errors import ConfigError
from shared.store import keys
from shared.store.client import Client, guarded, guarded_read, ttl_ms

MAX_ERROR_CHARS = 2000
DEFAULT_MAX_ENTRIES = 1000


@dataclass(frozen=True)
class DeadLetter:
    """One failed task. `error` is the error's text (type and message), truncated."""

    conv_id: str
    task_id: str
    error: str
    attempts: int
    at: float


class DeadLetters:
    """A bounded, expiring list of dead letters per tenant, newest first."""

    def __init__(
        self,
        client: Client,
        *,
        retention_s: float,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1:
            raise ConfigError(f"max_entries must be at least 1, got {max_entries!r}")
        self._r = client
        self._ttl = ttl_ms(retention_s)
        self._max = max_entries
        self._clock = clock

    @guarded
    def add(self, tenant: str, conv_id: str, task_id: str, error: str, attempts: int) -> None:
        """Record a task that gave up. Pass the error text only, never message content."""
        keys.check_id("conversation", conv_id)
        letter = DeadLetter(
            conv_id, str(task_id)[:200], str(error)[:MAX_ERROR_CHARS], int(attempts), self._clock()
        )
        key = keys.dead_letters(tenant)
        pipe = self._r.pipeline(transaction=True)
        pipe.lpush(key, json.dumps(asdict(letter), ensure_ascii=False))
        pipe.ltrim(key, 0, self._max - 1)
        pipe.pexpire(key, self._ttl)
        pipe.execute()

    @guarded_read
    def list(self, tenant: str, limit: int = 100) -> builtins.list[DeadLetter]:
        """Up to `limit` dead letters of the tenant, newest first."""
        if limit < 1:
            return []
        raw = self._r.lrange(keys.dead_letters(tenant), 0, limit - 1)
        return [DeadLetter(**json.loads(r)) for r in raw]
