"""A load generator light enough to measure a server sharing its two cores.

httpx costs its caller about a millisecond of CPU per 200 KB answer: on a 2-core machine
that starves the server it measures, and an API process twice as fast serves no more
requests per second. Here each client is one keep-alive HTTP/1.1 connection that sends a
request encoded once and reads the answer by its Content-Length, on uvloop: ~0.15 ms of
CPU per request. `Load.cpu_ms` reports what it cost anyway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import uvloop


@dataclass(frozen=True)
class Load:
    """Client-observed latencies (ms) of the requests after the warm-up, and what they took."""

    latencies: list[float]
    wall_s: float
    cpu_ms: float  # the load generator's own CPU per request

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.wall_s


Owner = Callable[[int], int | None]  # a client port -> the server process that took it


def run(
    url: str,
    path: str,
    body: bytes | None,
    *,
    clients: int,
    total: int,
    warmup: int = 2,
    spread: tuple[Owner, int] | None = None,
) -> Load:
    """`total` requests (POST `body` as JSON, or GET when None) from `clients` concurrent
    connections, each warmed up with `warmup` requests first; any status but 200 raises.

    `spread` (which process took a connection, and how many processes share the port):
    the kernel gives a new connection to whichever process accepts it first, often one
    process all of them; connections are then made again until each process has its share.
    """
    request = _encode(urlsplit(url).netloc, path, body)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_load(url, request, clients, total, warmup, spread))


async def _load(
    url: str,
    request: bytes,
    clients: int,
    total: int,
    warmup: int,
    spread: tuple[Owner, int] | None,
) -> Load:
    conns = await _connect(url, clients, spread)
    try:
        await asyncio.gather(*(_send(r, w, request, warmup, []) for r, w in conns))
        latencies: list[float] = []
        cpu, started = time.process_time(), time.perf_counter()
        share = [total // clients + (i < total % clients) for i in range(clients)]
        await asyncio.gather(
            *(_send(r, w, request, n, latencies) for (r, w), n in zip(conns, share, strict=True))
        )
        wall = time.perf_counter() - started
        return Load(latencies, wall, (time.process_time() - cpu) * 1000 / max(1, total))
    finally:
        for _, w in conns:
            w.close()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(url: str, clients: int, spread: tuple[Owner, int] | None) -> list[Conn]:
    parts = urlsplit(url)
    conns: list[Conn] = []
    held: dict[int | None, int] = {}
    for _ in range(100 * clients):
        if len(conns) == clients:
            return conns
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        if spread is not None:
            owner, processes = spread
            await asyncio.sleep(0.005)  # accepted by then
            taker = owner(writer.get_extra_info("sockname")[1])
            if held.get(taker, 0) >= -(-clients // processes):  # that process has its share
                writer.close()
                continue
            held[taker] = held.get(taker, 0) + 1
        conns.append((reader, writer))
    raise RuntimeError(f"could not spread {clients} connections over the processes: {held}")


async def _send(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    n: int,
    out: list[float],
) -> None:
    for _ in range(n):
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = _content_length(head)
        answer = await reader.readexactly(length)
        out.append((time.perf_counter() - started) * 1000)
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"{head.splitlines()[0].decode()}: {answer[:300]!r}")


def _encode(host: str, path: str, body: bytes | None) -> bytes:
    if body is None:
        return f"GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise RuntimeError(f"an answer without Content-Length: {head[:200]!r}")
