"""What a worker process keeps between tasks: one store, one event loop, one summarizer.

Celery's threads pool gives every in-flight task a thread, but the work itself runs on ONE
event loop in a thread of its own: a task thread submits `run_job` there and blocks on the
result. Hundreds of summaries then share one pooled HTTP client (the providers shard its
connections for exactly this) and the task threads sleep instead of passing the GIL back
and forth, which at a few hundred busy threads costs more CPU than the work itself.

The loop also runs `run_job`'s Redis calls, which are synchronous: each is a loopback round
trip of a fraction of a millisecond, during which the other jobs wait. That keeps the code
simple; a Redis that hangs stalls every job of the process until its socket timeout (2 s),
and every one of them would fail on that Redis anyway.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import structlog

from shared.errors import ConfigError, StoreUnavailable
from shared.logs import get_logger
from shared.providers import client_from_settings
from shared.service.failures import Failures
from shared.service.jobs import SummaryJob
from shared.service.precompute import JobOutcome, run_job
from shared.settings import Settings
from shared.store import Store, Ticket
from shared.store.breaker import provider_id, provider_label
from shared.summaries.extractive import ExtractiveSummarizer
from shared.summaries.summarizers import LLMSummarizer, Summarizer
from worker.metrics import WorkerMetrics
from worker.reaper import Reaper

T = TypeVar("T")

log = get_logger(__name__)


def pool_size(settings: Settings) -> int:
    """Redis connections one worker process may need at once (tasks and lease renewals)."""
    return max(100, 2 * settings.worker_concurrency + 16)


def make_summarizer(settings: Settings) -> Summarizer:
    """The configured provider's summarizer, else the offline extractive one."""
    client = client_from_settings(settings)
    if client is None:
        return ExtractiveSummarizer()
    model = settings.summarizer_model
    return LLMSummarizer(client, model, name=f"{settings.summarizer_protocol}:{model or 'default'}")


class Runtime:
    """The process-wide pieces, made on first use (so importing the app connects nothing)."""

    def __init__(self, settings: Settings, *, summarizer: Summarizer | None = None) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._summarizer = summarizer  # None: the configured one (`make_summarizer`)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failures: Failures | None = None
        self._reaper: Reaper | None = None
        self.metrics = WorkerMetrics()
        # the breaker guards the configured provider only (a summarizer given here has none)
        self.provider = provider_id(settings) if summarizer is None else None

    @property
    def failures(self) -> Failures:
        with self._lock:
            if self._failures is None:
                store, label = self.store_unlocked(), provider_label(self.settings)
                self._failures = Failures(store, self.settings, self.provider, label)
            return self._failures

    def start_reaper(self, app: Any) -> None:
        """Start this process's reaper for `app`'s queue (once; later calls do nothing)."""
        if self._reaper is not None:
            return
        with self._lock:
            if self._reaper is None:
                s = self.settings
                store = self.store_unlocked()
                self._reaper = Reaper(
                    app, store, s.summary_queue, s.reaper_interval_s, runner=self.submit
                )
                self._reaper.start()

    @property
    def store(self) -> Store:
        with self._lock:
            return self.store_unlocked()

    def store_unlocked(self) -> Store:
        """`store`, for callers already holding the runtime's lock."""
        if self._store is None:
            self._store = Store.from_url(
                self.settings.redis_url, self.settings, max_connections=pool_size(self.settings)
            )
        return self._store

    def check_store(self) -> None:
        """At start-up: `SystemExit` naming REDIS_URL and PREFIT_REDIS_CLUSTER when Redis's
        cluster mode is not the configured one (a Redis that does not answer yet is not an
        error: jobs retry until it does)."""
        try:
            self.store.check_mode(self.settings.redis_url)
        except ConfigError as exc:
            log.error("worker.misconfigured", error=str(exc))
            raise SystemExit(f"prefit worker: {exc}") from None
        except StoreUnavailable:
            log.warning("worker.store_unreachable", detail="the store is checked on first use")

    @property
    def summarizer(self) -> Summarizer:
        with self._lock:
            if self._summarizer is None:
                self._summarizer = make_summarizer(self.settings)
            return self._summarizer

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the process's loop and wait for it; the caller's log context follows."""
        bound = structlog.contextvars.get_contextvars()
        future = asyncio.run_coroutine_threadsafe(_with_context(coro, bound), self._running())
        return future.result()

    def submit(self, job: SummaryJob, ticket: Ticket) -> Future[JobOutcome]:
        """Start `job` on the process's loop without waiting for it: the reaper's runs of
        unsent jobs while the broker is down (worker/reaper.py)."""
        coro = run_job(
            job,
            store=self.store,
            summarizer=self.summarizer,
            settings=self.settings,
            owner=f"{ticket.task_id}/{uuid.uuid4().hex[:8]}",
            ticket=ticket,
            provider=self.provider,
        )
        return asyncio.run_coroutine_threadsafe(_with_context(coro, {}), self._running())

    def poke_loop(self, callback: Callable[[], None]) -> None:
        """Have the process's loop call `callback` soon (the watchdog's probe); with no loop
        running yet, nothing can be stuck on it: `callback` is called now."""
        with self._lock:
            loop = self._loop
        if loop is None:
            callback()
        else:
            loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        """Stop the reaper, close the summarizer's HTTP client, stop the loop, close the store."""
        with self._lock:
            loop, thread, summarizer = self._loop, self._thread, self._summarizer
            self._loop = self._thread = self._summarizer = None
            store, self._store = self._store, None
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.stop()
        if loop is not None and thread is not None:
            client = getattr(summarizer, "client", None)
            if client is not None and hasattr(client, "aclose"):
                asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
        if store is not None:
            store.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="prefit-loop", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


async def _with_context(coro: Coroutine[Any, Any, T], bound: dict[str, Any]) -> T:
    # Each asyncio task runs in its own copy of the context: binding here stays in this job.
    structlog.contextvars.bind_contextvars(**bound)
    return await coro
