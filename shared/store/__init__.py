"""The Redis store: conversations, records, calibration, usage, dead letters, leases, jobs, faults.

All parts share one sync client (thread safe; FastAPI handlers call it from the threadpool): a
`redis.Redis`, or a `RedisCluster` with `PREFIT_REDIS_CLUSTER=true` (shared/store/client.py;
every script and MULTI touches one slot, see shared/store/keys.py). Every public method turns Redis
connection faults and timeouts into `StoreUnavailable`. Key formats are in shared/store/keys.py.

    store = Store.from_url(settings.redis_url, settings)
    store.conversations.append(tenant, conv_id, new_messages, expected_length=n)
    record = store.records.best(tenant, conv_id)
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared.counting.calibration import SettlingRule
from shared.errors import StoreUnavailable
from shared.logs import get_logger
from shared.settings import Settings
from shared.store.blocks import Blocks, Range
from shared.store.breaker import Breakers, BreakerState
from shared.store.calibration import Calibration, RedisRatios, TenantRatios
from shared.store.claims import Claim, Claims
from shared.store.client import Client, check_mode, connect, guarded
from shared.store.conversations import Conversation, ConversationMeta, ConversationStore
from shared.store.deadletters import DeadLetter, DeadLetters
from shared.store.inflight import InFlight, Ticket
from shared.store.leases import HeldLease, Lease
from shared.store.pending import Pending
from shared.store.records import RecordStore
from shared.store.replication import Replication
from shared.store.unsent import Unsent, UnsentJob
from shared.store.usage import Usage, UsageStore

log = get_logger(__name__)

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
    "Pending",
    "Range",
    "RecordStore",
    "RedisRatios",
    "Replication",
    "Store",
    "TenantRatios",
    "Ticket",
    "Unsent",
    "UnsentJob",
    "Usage",
    "UsageStore",
]


@dataclass(frozen=True)
class Store:
    """Every part of the store on one client."""

    client: Client
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
    pending: Pending
    unsent: Unsent

    @classmethod
    def from_client(cls, client: Client, settings: Settings) -> Store:
        retention = settings.retention_s
        backoff, backoff_max = settings.breaker_backoff_s, settings.breaker_backoff_max_s
        leases = Lease(client)
        replication = Replication(
            client,
            min_acks=settings.redis_min_replicas_ack,
            socket_timeout_s=settings.redis_socket_timeout_s,
        )
        records = RecordStore(client, retention_s=retention, replication=replication)
        return cls(
            client=client,
            conversations=ConversationStore(client, retention_s=retention, replication=replication),
            records=records,
            ratios=RedisRatios(
                client,
                retention_s=settings.calibration_retention_s,
                rule=SettlingRule(
                    settle_after=settings.calibration_settle_after,
                    tolerance=settings.calibration_tolerance,
                ),
            ),
            usage=UsageStore(client),
            dead_letters=DeadLetters(
                client, retention_s=retention, max_entries=settings.dead_letters_max
            ),
            leases=leases,
            claims=Claims(client, leases, records, retention_s=retention),
            inflight=InFlight(client),
            breakers=Breakers(client, base_s=backoff, max_s=backoff_max),
            blocks=Blocks(client, base_s=backoff, max_s=backoff_max),
            pending=Pending(client),
            unsent=Unsent(client),
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
        """A store on a new client: a `RedisCluster` with `settings.redis_cluster` (which reads
        the cluster's topology now: `StoreUnavailable` if no node answers, `ConfigError` if
        `url` is not a cluster node), else a standalone client, which connects on its first
        command.

        Timeouts and the connection-pool size (per node, on a cluster) default to the settings.
        """
        client = connect(
            url,
            cluster=settings.redis_cluster,
            socket_timeout=socket_timeout or settings.redis_socket_timeout_s,
            connect_timeout=connect_timeout or settings.redis_connect_timeout_s,
            max_connections=max_connections or settings.redis_max_connections,
        )
        return cls.from_client(client, settings)

    def check_mode(self, url: str) -> None:
        """At start-up: `ConfigError` if Redis's cluster mode is not the one the store was
        built for (`INFO cluster`), naming REDIS_URL and PREFIT_REDIS_CLUSTER. A Redis that
        does not answer now, or refuses INFO (some hosted ones, fakeredis), is not an error
        here: its commands fail until it answers."""
        try:
            guarded(check_mode)(self.client, url)
        except StoreUnavailable:
            log.warning("store.mode_unchecked", reason="redis did not answer")
        except redis.ResponseError as exc:
            log.warning("store.mode_unchecked", reason=f"INFO refused: {exc}"[:200])

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
