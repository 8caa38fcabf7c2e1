"""One summarizer per conversation across all workers, and one queued task per trigger.

A lease is a key holding its owner's id with a TTL (SET NX PX). Renewing and releasing are
compare-and-set in Lua, so a late duplicate task can neither extend nor delete a lease that
has passed to another worker. A held lease is renewed every ttl/3 by the `Lease`'s one
background thread (shared by every lease the process holds: a thread per job would cost more
CPU than the job) while the work runs; the work calls `check()` before each write and gets
`LeaseLost` once the lease is gone.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from types import TracebackType

from shared.errors import ConfigError, LeaseLost, StoreUnavailable
from shared.logs import get_logger
from shared.store import keys
from shared.store.client import Client, eval_in, guarded, guarded_read, text, ttl_ms
from shared.store.inflight import InFlight, Ticket

log = get_logger(__name__)

# KEYS: lease. ARGV: owner, ttl ms.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease. ARGV: owner.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

MAX_OWNER_CHARS = 200


class Lease:
    """Conversation leases of every tenant, on one Redis client."""

    def __init__(self, client: Client, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._r = client
        self._clock = clock
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._keeper = _Keeper(self)

    @guarded
    def acquire(self, tenant: str, conv_id: str, owner: str, ttl: float) -> bool:
        """Take the conversation's lease for `ttl` seconds unless someone holds it."""
        key = keys.conv_lease(tenant, conv_id)
        return bool(self._r.set(key, check_owner(owner), nx=True, px=ttl_ms(ttl)))

    @guarded
    def renew(
        self, tenant: str, conv_id: str, owner: str, ttl: float, ticket: Ticket | None = None
    ) -> bool:
        """Extend the lease to `ttl` seconds from now, only if `owner` still holds it.

        With a `ticket`, the job's in-flight entry is pushed back in the same round trip.
        """
        key = keys.conv_lease(tenant, conv_id)
        if ticket is None:
            return bool(self._renew(keys=[key], args=[check_owner(owner), ttl_ms(ttl)]))
        pipe = self._r.pipeline(transaction=False)
        eval_in(pipe, RENEW, [key], [check_owner(owner), ttl_ms(ttl)])
        InFlight.renew_in(pipe, ticket, ttl)
        return bool(pipe.execute()[0])

    @guarded
    def release(self, tenant: str, conv_id: str, owner: str) -> bool:
        """Give the lease up, only if `owner` holds it; True if it was released."""
        key = keys.conv_lease(tenant, conv_id)
        return bool(self._release(keys=[key], args=[check_owner(owner)]))

    @guarded_read
    def owner(self, tenant: str, conv_id: str) -> str | None:
        """Who holds the conversation's lease now, if anyone."""
        raw = self._r.get(keys.conv_lease(tenant, conv_id))
        return text(raw) if raw is not None else None

    def hold(self, tenant: str, conv_id: str, owner: str, ttl: float) -> HeldLease | None:
        """Acquire and return a `HeldLease` (use it as a context manager); None if taken."""
        started = self._clock()
        if not self.acquire(tenant, conv_id, owner, ttl):
            return None
        return HeldLease(self, tenant, conv_id, owner, ttl, valid_until=started + ttl)

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def keeper(self) -> _Keeper:
        return self._keeper


class HeldLease:
    """A held lease renewed every ttl/3 (by its `Lease`'s keeper thread) until `with` ends.

    The lease counts as lost once a renewal is refused, or once `ttl` has passed since the
    last renewal known to have succeeded (Redis unreachable meanwhile): either way another
    worker may hold it now, so `check()` raises `LeaseLost`.
    """

    def __init__(
        self,
        leases: Lease,
        tenant: str,
        conv_id: str,
        owner: str,
        ttl: float,
        *,
        valid_until: float,
        ticket: Ticket | None = None,
    ) -> None:
        self._leases = leases
        self.tenant, self.conv_id, self.owner, self.ttl = tenant, conv_id, owner, ttl
        self.ticket = ticket  # the job's in-flight entry, renewed with the lease
        self._valid_until = valid_until
        self._refused = False
        self._closed = False

    @property
    def lost(self) -> bool:
        return self._refused or self._leases.clock() >= self._valid_until

    def check(self) -> None:
        """Raise `LeaseLost` if the lease may now belong to someone else."""
        if self.lost:
            raise LeaseLost(f"lease on conversation {self.conv_id!r} lost by {self.owner!r}")

    def __enter__(self) -> HeldLease:
        self._leases.keeper.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop renewing and release (a no-op if the lease already passed to another owner).

        A renewal already on its way may still land first; the release follows it. One
        landing after the release finds the key gone (or another owner's) and changes nothing.
        """
        if self._closed:  # released already (`Claims.release`) or closed twice
            return
        self.stop()
        try:
            self._leases.release(self.tenant, self.conv_id, self.owner)
        except StoreUnavailable:
            # It expires on its own within ttl.
            log.warning("lease.release_failed", tenant=self.tenant, conv_id=self.conv_id)

    def stop(self) -> None:
        """Stop renewing (the keeper drops the lease at its next turn); `close` then does
        nothing: the caller releases the lease itself."""
        self._closed = True

    def renew(self) -> bool:
        """One renewal (the keeper calls this every ttl/3); False once it should stop."""
        if self._closed:
            return False
        started = self._leases.clock()
        try:
            renewed = self._leases.renew(
                self.tenant, self.conv_id, self.owner, self.ttl, self.ticket
            )
        except Exception as exc:  # keep trying: check() turns a long outage into LeaseLost
            log.warning(
                "lease.renew_failed",
                tenant=self.tenant,
                conv_id=self.conv_id,
                error=type(exc).__name__,
            )
            return not self._closed
        if not renewed:
            if not self._closed:
                self._refused = True
                log.warning("lease.lost", tenant=self.tenant, conv_id=self.conv_id)
            return False
        self._valid_until = started + self.ttl
        return not self._closed


class _Keeper:
    """One daemon thread renewing every held lease of a `Lease`, each every ttl/3.

    Started on the first lease held; sleeps until the next renewal is due. A renewal that
    hangs on Redis (up to the socket timeout) delays the others by as much, which is far
    under the ttl/3 margin before any of them would count as lost.
    """

    def __init__(self, leases: Lease) -> None:
        self._leases = leases
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, HeldLease]] = []  # (monotonic time, seq, lease)
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, held: HeldLease) -> None:
        with self._cond:
            first = not self._due or time.monotonic() + held.ttl / 3 < self._due[0][0]
            heapq.heappush(self._due, (time.monotonic() + held.ttl / 3, next(self._seq), held))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self._thread.start()
            elif first:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    # a closed lease stays queued until its turn, then is dropped unrenewed
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, held = heapq.heappop(self._due)
            if held.renew():
                with self._cond:
                    heapq.heappush(
                        self._due, (time.monotonic() + held.ttl / 3, next(self._seq), held)
                    )


def check_owner(owner: str) -> str:
    """`owner` if it can name a lease holder, else `ConfigError`."""
    if not isinstance(owner, str) or not owner or len(owner) > MAX_OWNER_CHARS:
        raise ConfigError(f"lease owner must be a non-empty string of at most {MAX_OWNER_CHARS}")
    return owner
