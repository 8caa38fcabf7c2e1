"""Which replica this process is, for the dashboards: its container's name, not its address.

Prometheus finds the replicas through Docker's DNS and knows them by IP, which changes at every
re-creation. Docker's own DNS server (127.0.0.11 inside a container on a compose network)
answers a reverse (PTR) query for a container's address with `<container>.<network>`
(`prefit-worker-2.prefit_default`); the process asks it about its own address once and puts
the first label on every series it exposes as `replica` (`with_replica`), and Prometheus's
relabelling makes that the `instance` (deploy/prometheus/prometheus.yml). The query goes to
that server itself: the resolver would answer from /etc/hosts, which holds the container id.

`PREFIT_REPLICA_NAME` names a process explicitly (another orchestrator: a pod's name); outside
Docker, with none given, there is no `replica` label.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from shared.settings import Settings

DOCKER_DNS = "127.0.0.11"
RESOLV_CONF = Path("/etc/resolv.conf")
PTR = 12
LABEL = "replica"


def replica_name(settings: Settings, resolv_conf: Path = RESOLV_CONF) -> str | None:
    """This process's replica name: PREFIT_REPLICA_NAME, else its container's name from
    Docker's DNS, else None."""
    if settings.replica_name:
        return settings.replica_name
    if not _docker_dns(resolv_conf):
        return None
    with contextlib.suppress(OSError):
        name = reverse_name(socket.gethostbyname(socket.gethostname()))
        return name.split(".", 1)[0] if name else None
    return None


def reverse_name(
    address: str, server: str = DOCKER_DNS, *, port: int = 53, timeout_s: float = 1.0
) -> str | None:
    """The name a DNS server gives for an IPv4 `address` (a PTR query over UDP), or None."""
    query_id = secrets.randbelow(1 << 16)
    qname = ".".join(reversed(address.split("."))) + ".in-addr.arpa"
    question = _encode_name(qname) + struct.pack("!HH", PTR, 1)
    packet = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(packet, (server, port))
        answer = sock.recv(4096)
    return _ptr_answer(answer, query_id)


def with_replica(source: CollectorRegistry, replica: str | None) -> CollectorRegistry:
    """`source`, every sample labelled `replica` (`source` itself when there is no name)."""
    if replica is None:
        return source
    labelled = CollectorRegistry(auto_describe=False)
    labelled.register(_Labelled(source, replica))
    return labelled


class _Labelled(Collector):
    """A registry's metrics with one more label on each sample."""

    def __init__(self, source: CollectorRegistry, replica: str) -> None:
        self._source = source
        self._replica = replica

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():
            out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            out.samples = [
                s._replace(labels={**s.labels, LABEL: self._replica}) for s in metric.samples
            ]
            yield out


def _docker_dns(resolv_conf: Path) -> bool:
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[:2] == ["nameserver", DOCKER_DNS] for line in lines)


def _encode_name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """A (possibly compressed) domain name at `offset`, and the offset just past it."""
    labels: list[str] = []
    end: int | None = None
    for _ in range(128):  # a loop of pointers is a malformed answer, not a hang
        length = data[offset]
        if length & 0xC0 == 0xC0:
            end = offset + 2 if end is None else end
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length == 0:
            return ".".join(labels), end if end is not None else offset + 1
        labels.append(data[offset + 1 : offset + 1 + length].decode(errors="replace"))
        offset += 1 + length
    raise ValueError("a DNS name that does not end")


def _ptr_answer(data: bytes, query_id: int) -> str | None:
    """The first PTR record's name in a DNS answer to `query_id`, or None."""
    try:
        got_id, flags, questions, answers = struct.unpack("!HHHH", data[:8])
        if got_id != query_id or flags & 0x000F:  # not ours, or an error (NXDOMAIN...)
            return None
        offset = 12
        for _ in range(questions):
            offset = _read_name(data, offset)[1] + 4
        for _ in range(answers):
            offset = _read_name(data, offset)[1]
            kind, _, _, size = struct.unpack("!HHIH", data[offset : offset + 10])
            offset += 10
            if kind == PTR:
                return _read_name(data, offset)[0] or None
            offset += size
    except (struct.error, IndexError, ValueError):
        return None
    return None
