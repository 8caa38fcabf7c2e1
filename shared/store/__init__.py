"""The Redis store: conversations, records, calibration, usage, dead letters, leases, faults.

All parts share one sync `redis.Redis` client (thread safe; FastAPI handlers call it from the
threadpool). Every public method turns Redis connection faults and timeouts into
`StoreUnavailable`. Key formats are in shared/keys.py.

    store = Store.from_url(settings.redis_url, settings)
    store.conversations.append(tenant, conv_id, new_messages, expected_length=n)
    record = store.records.best(tenant, conv_id)
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared.settings import Settings
from shared.settling import SettlingRule
from shared.store.blocks import Blocks, Range
from shared.store.breaker import Breakers, BreakerState
from shared.store.calibration import Calibration, RedisRatios, TenantRatios
from shared.store.claims import Claim, Claims
from shared.store.client import connect, guarded
from shared.store.conversations import Conversation, ConversationMeta, ConversationStore
from shared.store.deadletters import DeadLetter, DeadLetters
from shared.store.inflight import InFlight, Ticket
from shared.store.leases import HeldLease, Lease
from shared.store.records import RecordStore
from shared.store.usage import Usage, UsageStore

__all__ = [
    "Blocks",
    "BreakerState",
    "Breakers",
    "Calibration",
    "Claim",
    "Claims",
    "Conversation",
    "ConversationMeta",
    "ConversationStore",
    "DeadLetter",
    "DeadLetters",
    "HeldLease",
    "InFlight",
    "Lease",
    "Range",
    "RecordStore",
    "RedisRatios",
    "Store",
    "TenantRatios",
    "Ticket",
    "Usage",
    "UsageStore",
]


@dataclass(frozen=True)
class Store:
    """Every part of the store on one client."""

    client: redis.Redis
    conversations: ConversationStore
    records: RecordStore
    ratios: RedisRatios
    usage: UsageStore
    dead_letters: DeadLetters
    leases: Lease
    claims: Claims
    inflight: InFlight
    breakers: Breakers
    blocks: Blocks

    @classmethod
    def from_client(cls, client: redis.Redis, settings: Settings) -> Store:
        retention = settings.retention_s
        backoff, backoff_max = settings.breaker_backoff_s, settings.breaker_backoff_max_s
        leases = Lease(client)
        return cls(
            client=client,
            conversations=ConversationStore(client, retention_s=retention),
            records=RecordStore(client, retention_s=retention),
            ratios=RedisRatios(
                client,
                retention_s=settings.calibration_retention_s,
                rule=SettlingRule(
                    settle_after=settings.calibration_settle_after,
                    tolerance=settings.calibration_tolerance,
                ),
            ),
            usage=UsageStore(client),
            dead_letters=DeadLetters(client, retention_s=retention),
            leases=leases,
            claims=Claims(client, leases, retention_s=retention),
            inflight=InFlight(client),
            breakers=Breakers(client, base_s=backoff, max_s=backoff_max),
            blocks=Blocks(client, base_s=backoff, max_s=backoff_max),
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        settings: Settings,
        *,
        socket_timeout: float | None = None,
        connect_timeout: float | None = None,
        max_connections: int | None = None,
    ) -> Store:
        """A store on a new client (no connection is made until the first command).

        Timeouts and the connection-pool size default to the settings.
        """
        client = connect(
            url,
            socket_timeout=socket_timeout or settings.redis_socket_timeout_s,
            connect_timeout=connect_timeout or settings.redis_connect_timeout_s,
            max_connections=max_connections or settings.redis_max_connections,
        )
        return cls.from_client(client, settings)

    def ping(self) -> bool:
        """True if Redis answers now (for readiness checks); never raises."""
        try:
            return bool(self._ping())
        except Exception:
            return False

    @guarded
    def _ping(self) -> bool:
        return bool(self.client.ping())

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
