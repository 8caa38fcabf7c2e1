"""No store operation needs keys from two Redis Cluster slots: every script (the keys it is
given and every key it touches), every MULTI and every multi-key command stays in one slot.

One workload calls every operation of every part of the store. A redis-server of the test's
own records it with MONITOR, which also shows each command a Lua script runs: the keys of
each such unit are mapped to their slot with redis-py's `key_slot`. Each script of
shared/store must have run, so a new one cannot go unchecked. The same workload runs on the
session's store too: on the cluster backend, against a real cluster.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis
from redis.crc import key_slot

from shared.commands.redisproc import RedisProcess
from shared.hashing import prefix_hashes
from shared.settings import Settings
from shared.store import (
    Range,
    Store,
    Ticket,
    blocks,
    breaker,
    calibration,
    claims,
    directory,
    inflight,
    leases,
    records,
    scripts,
    tally,
    unsent,
    usage,
)
from shared.store.increments import SINCE, Increments
from shared.store.lookup import RecordLookup
from shared.store.tally import Tally
from shared.store.writes import Append, Replacement
from shared.summaries.book import SummaryRecord
from tests.builders import numbered_chat
from tests.redisbackend import require_redis_server
from tests.shared.store.helpers import tenant_keys

MODULES = (
    blocks, breaker, calibration, claims, directory, inflight, leases, records, tally, unsent,
    usage,
)  # fmt: skip
# pieces of Lua that scripts are made of, never run alone
FRAGMENTS = {
    scripts.PUSH, scripts.UNLINK, scripts.TOUCH, scripts.META, scripts.CHAIN, scripts.MEASURE,
    inflight.NOW,
}  # fmt: skip
ALL_KEYS = {"DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "WATCH"}
NO_KEYS = {"HELLO", "PING", "INFO", "ECHO", "MULTI", "EXEC", "DISCARD", "TIME", "SCRIPT", "CLIENT"}
_LINE = re.compile(r"^\S+ \[\d+ (\S+)\] (.*)$")
_ARG = re.compile(r'"((?:\\.|[^"\\])*)"')


def store_scripts() -> dict[str, str]:
    """Every Lua script of shared/store, by SHA-1: module constants that call Redis."""
    found = {SINCE}
    for module in (*MODULES, scripts):
        for value in vars(module).values():
            if isinstance(value, str) and "redis.call(" in value and value not in FRAGMENTS:
                found.add(value)
    return {hashlib.sha1(s.encode()).hexdigest(): s for s in found}


def workload(store: Store, tenant: str) -> None:
    """Every operation of every part of the store, once at least."""
    conv, fork = f"c-{uuid.uuid4().hex[:6]}", f"f-{uuid.uuid4().hex[:6]}"
    msgs = numbered_chat(8)
    h = prefix_hashes(msgs)
    cs, rs = store.conversations, store.records
    cs.append(tenant, conv, msgs[:6])
    cs.writes.append(tenant, conv, Append(msgs[6:], counts=[3, 3], counter="x", upto_max=8))
    cs.read(tenant, conv)
    cs.snapshot(tenant, conv)
    cs.hashes(tenant, conv)
    cs.meta(tenant, conv)
    cs.exists(tenant, conv)
    rs.put(tenant, conv, SummaryRecord(4, h[4], "to 4"))
    rs.best(tenant, conv)
    rs.best(tenant, conv, h, upto_max=6)
    rs.book(tenant, conv)
    rs.list(tenant, conv)
    RecordLookup(store.client).longest(tenant, [(4, h[4]), (6, h[6])])
    Increments(store.client).since(tenant, conv, start=2, prefix_hash=h[2])
    cs.append(tenant, fork, msgs)
    found = rs.get(tenant, h[4])
    assert found is not None
    rs.put(tenant, fork, found)  # a fork reuses the record: copied into its own slot
    t = store.ratios
    t.observe(tenant, "m", 1.1)
    t.get(tenant, "m")
    t.calibration(tenant, "m")
    store.usage.add(tenant, 1, 2, 0.5)
    store.usage.get(tenant)
    store.dead_letters.add(tenant, conv, "task", "Error", 1)
    store.dead_letters.list(tenant)
    _jobs(store, tenant, conv, h)
    whole = Replacement(msgs[:5], h[:6], cumulative=[1, 2, 3, 4, 5], upto_max=5)
    cs.writes.replace(tenant, fork, whole)
    tallies = Tally(store.client, retention_s=60)
    counts = list(range(1, 9))
    tallies.rebuild(tenant, conv, counter="y", last_hash=h[8], head_end=0, cumulative=counts)
    tallies.tip(tenant, conv, counter="y", tail=2)
    tallies.read(tenant, conv, start=0, stop=2)
    tallies.at(tenant, conv, [0, 3, 8])
    tallies.delete(tenant, conv)
    cs.replace(tenant, conv, msgs[:3])
    cs.delete(tenant, conv)
    cs.delete(tenant, fork)


def _jobs(store: Store, tenant: str, conv: str, h: list[str]) -> None:
    """The workers' operations: leases, claims, the in-flight registry, breakers, blocks."""
    queue, provider = f"q-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:12]
    ticket = Ticket(uuid.uuid4().hex, queue, {"tenant": tenant})
    claim = store.claims.claim(
        tenant, conv, "w1", 30, ratio_of="m", ticket=ticket, provider=provider
    )
    assert claim.held is not None
    store.leases.renew(tenant, conv, "w1", 30, ticket)
    store.leases.renew(tenant, conv, "w1", 30)
    store.claims.commit(tenant, conv, SummaryRecord(6, h[6], "to 6"), (1, 1, 0.0))
    store.claims.release(claim.held)
    store.leases.acquire(tenant, conv, "w2", 30)
    store.leases.owner(tenant, conv)
    store.leases.release(tenant, conv, "w2")
    store.inflight.register(ticket, 0.001)
    store.inflight.defer(ticket, 0.0, 0.001)
    store.inflight.running(queue)
    store.inflight.reap(queue)
    store.inflight.leave(ticket)
    b = store.breakers
    b.trip(provider, "label", "error")
    b.state(provider)
    b.probe(provider, 1.0)
    b.release_probe(provider)
    b.all()
    b.reset(provider)
    rng = Range("none", 6, h[6])
    store.blocks.fail(tenant, conv, rng, "E", limit=0, permanent=True)
    store.blocks.get(tenant, conv)
    store.pending.mark(tenant, conv, "ahead-3", "none", 5)
    store.pending.clear(tenant, conv, "ahead-3")
    store.unsent.keep(queue, {"tenant": tenant, "conversation_id": conv}, 0)
    (kept,) = store.unsent.due(queue, 10)
    store.unsent.sent(queue, kept)
    store.unsent.count(queue)


@dataclass
class Unit:
    """What must stay in one slot: a script and what it ran, a MULTI, or one command."""

    what: str
    keys: set[str] = field(default_factory=set)

    def slots(self) -> set[int]:
        return {key_slot(k.encode()) for k in self.keys}


def units(lines: list[str]) -> tuple[list[Unit], set[str]]:
    """MONITOR's lines grouped into units, and the SHA-1s of the scripts that ran."""
    out: list[Unit] = []
    ran: set[str] = set()
    current: Unit | None = None  # the open script or MULTI
    in_multi = False
    for line in lines:
        found = _LINE.match(line)
        assert found, line
        source, args = found.group(1), [_unescaped(a) for a in _ARG.findall(found.group(2))]
        name = args[0].upper()
        if source != "lua" and not in_multi:
            current = None
        if name == "MULTI":
            current, in_multi = Unit("MULTI"), True
            out.append(current)
            continue
        if name == "EXEC":
            current, in_multi = None, False
            continue
        if name in ("EVAL", "EVALSHA"):
            sha = hashlib.sha1(args[1].encode()).hexdigest() if name == "EVAL" else args[1]
            ran.add(sha)
            declared = set(args[3 : 3 + int(args[2])])
            if current is None:
                current = Unit(f"script {sha[:10]}")
                out.append(current)
            current.keys |= declared
            continue
        ks = _keys(name, args[1:])
        if current is not None:
            current.keys |= ks
        elif len(ks) > 1:
            out.append(Unit(name, ks))
    return out, ran


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b", "\\": "\\", '"': '"'}


def _unescaped(arg: str) -> str:
    """An argument as MONITOR quoted it (`sdscatrepr`), back as it was sent."""
    return re.sub(
        r"\\(x[0-9a-f]{2}|.)",
        lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 3 else _ESCAPES.get(m[1], m[1]),
        arg,
    )


def _keys(name: str, args: list[str]) -> set[str]:
    if name in NO_KEYS:
        return set()
    return set(args) if name in ALL_KEYS else set(args[:1])


@pytest.fixture(scope="module")
def monitored() -> Iterator[tuple[Store, list[str]]]:
    """A store on a redis-server of this module's own, and the lines MONITOR saw while the
    workload ran on it."""
    require_redis_server()
    with RedisProcess() as proc:
        watcher = redis.Redis.from_url(proc.url)
        conn = watcher.connection_pool.get_connection()
        conn.send_command("MONITOR")
        assert conn.read_response() == b"OK"
        store = Store.from_url(proc.url, Settings(redis_cluster=False))
        workload(store, f"t-{uuid.uuid4().hex[:8]}")
        mark = uuid.uuid4().hex
        store.client.echo(mark)
        lines: list[str] = []
        while True:  # everything the workload sent comes before the mark
            line = conn.read_response().decode()
            if mark in line:
                break
            lines.append(line)
        store.close()
        watcher.close()
        yield store, lines


def test_every_script_multi_and_multi_key_command_stays_in_one_slot(
    monitored: tuple[Store, list[str]],
) -> None:
    """Each unit's keys, the ones a script touches without declaring them included, hash to
    one slot; the workload ran every script of shared/store."""
    _, lines = monitored
    found, ran = units([line for line in lines if '"HELLO"' not in line])
    crossing = [(u.what, sorted(u.keys)) for u in found if len(u.slots()) > 1]
    assert crossing == []
    assert sum(1 for u in found if u.what.startswith("script")) > 30
    missing = {sha: body[:60] for sha, body in store_scripts().items() if sha not in ran}
    assert missing == {}, "scripts the workload never ran: make it run them"


def test_the_check_catches_a_script_that_crosses_slots() -> None:
    """A script given a conversation key and a tenant key is reported."""
    lines = [
        '1.0 [0 127.0.0.1:1] "EVAL" "x" "1" "prefit:v3:{t/c}:meta"',
        '1.0 [0 lua] "GET" "prefit:v3:{t}:usage"',
        '1.0 [0 127.0.0.1:1] "MGET" "prefit:v3:{t}:dir:a" "prefit:v3:{t}:dir:b"',
    ]
    found, ran = units(lines)
    assert [len(u.slots()) for u in found] == [2, 1]
    assert ran == {hashlib.sha1(b"x").hexdigest()}


def test_the_workload_runs_on_the_sessions_store(store: Store, tenant: str) -> None:
    """Every operation works on the session's Redis (a real cluster on the cluster backend),
    and once both conversations are deleted no record nor copy of one is left."""
    workload(store, tenant)
    left = tenant_keys(store.client, tenant)
    assert left and [k for k in left if ":rec:" in k or ":dir:" in k] == []
