"""Test helpers: a look at the raw keys of one tenant, and threads started at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shared.store import keys
from shared.store.client import Client


def tenant_keys(client: Client, tenant: str) -> set[str]:
    """Every key of the tenant and its conversations (SCAN, never KEYS; every node of a
    cluster)."""
    return {k.decode() for k in client.scan_iter(match=keys.tenant_pattern(tenant), count=1000)}


def run_threads(fn: Callable[[int], object], n: int) -> list[object]:
    """Run fn(0..n-1) on n threads at once; return their results, re-raising any failure."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def target(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
