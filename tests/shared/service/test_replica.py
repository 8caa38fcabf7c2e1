"""A replica's name from Docker's DNS (a PTR answer as Docker 26.1 sends it), the setting that
overrides it, none outside Docker, and the `replica` label on every exposed sample."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

from shared.service.replica import _ptr_answer, replica_name, reverse_name, with_replica
from shared.settings import Settings

# Docker 26.1.5's embedded DNS (127.0.0.11) answering `PTR 7.0.19.172.in-addr.arpa` inside a
# compose project's container: the question, then one answer compressed to point at it.
DOCKER_ANSWER = (
    b"\x8eh\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x017\x010\x0219\x03172\x07in-addr\x04arpa"
    b"\x00\x00\x0c\x00\x01\x017\x010\x0219\x03172\x07in-addr\x04arpa\x00\x00\x0c\x00\x01\x00\x00"
    b"\x02X\x00\x1d\x0cprefit-api-1\x0eprefit_default\x00"
)


def test_docker_answer_names_the_container_and_network() -> None:
    """The PTR record of Docker's answer is `<container>.<network>`; another query's id, an
    error code or a truncated packet give None."""
    query_id = struct.unpack("!H", DOCKER_ANSWER[:2])[0]
    assert _ptr_answer(DOCKER_ANSWER, query_id) == "prefit-api-1.prefit_default"
    assert _ptr_answer(DOCKER_ANSWER, query_id + 1) is None
    nxdomain = DOCKER_ANSWER[:3] + bytes([DOCKER_ANSWER[3] | 0x03]) + DOCKER_ANSWER[4:]
    assert _ptr_answer(nxdomain, query_id) is None
    assert _ptr_answer(DOCKER_ANSWER[:40], query_id) is None


def test_reverse_name_asks_the_server_over_udp() -> None:
    """A query for an address reaches the server as a PTR question for its in-addr.arpa name,
    and the answer's name comes back."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    asked: list[bytes] = []

    def answer() -> None:
        query, client = server.recvfrom(512)
        asked.append(query)
        server.sendto(query[:2] + DOCKER_ANSWER[2:], client)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        name = reverse_name("172.19.0.7", "127.0.0.1", port=server.getsockname()[1])
    finally:
        thread.join(timeout=5)
        server.close()
    assert name == "prefit-api-1.prefit_default"
    [query] = asked
    assert b"\x017\x010\x0219\x03172\x07in-addr\x04arpa\x00\x00\x0c\x00\x01" in query


def test_the_setting_wins_and_outside_docker_there_is_no_name(tmp_path: Path) -> None:
    """PREFIT_REPLICA_NAME names the process; without it a resolver that is not Docker's
    gives no name (and no query is sent)."""
    plain = tmp_path / "resolv.conf"
    plain.write_text("nameserver 10.0.0.2\n")
    assert replica_name(Settings(replica_name="pod-7"), plain) == "pod-7"
    assert replica_name(Settings(), plain) is None
    assert replica_name(Settings(), tmp_path / "absent") is None


def test_every_sample_gets_the_replica_label() -> None:
    """`with_replica` adds `replica` to each sample (counters' _total and _created too); with
    no name the registry is exposed as it is."""
    registry = CollectorRegistry()
    Counter("prefit_things", "things", ["kind"], registry=registry).labels("a").inc()
    text = generate_latest(with_replica(registry, "prefit-worker-2")).decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all('replica="prefit-worker-2"' in line for line in samples)
    assert 'prefit_things_total{kind="a",replica="prefit-worker-2"} 1.0' in text
    assert with_replica(registry, None) is registry
