"""The Celery app of the summary workers: `celery -A worker.app worker` (threads pool by default).

Summaries are I/O bound (a worker mostly waits on the summarizer's HTTP answer), so one
process runs `worker_concurrency` tasks on threads rather than one per forked process:
hundreds of summaries in flight cost one interpreter. Run more processes (or hosts) to
scale further; the per-conversation lease keeps them from duplicating work.

Delivery is at least once: acks are late and a task whose worker died is handed out again
(on Redis once the visibility timeout has passed, on RabbitMQ as soon as the worker's
connection is gone). There is no result backend: a summary's only product is the record the
task writes to the store. The broker is Redis or RabbitMQ (`shared.service.broker`).
"""

from __future__ import annotations

import gc
import logging
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import (
    celeryd_init,
    setup_logging,
    worker_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from shared.logs import configure_logging, get_logger
from shared.service.broker import broker_kind, celery_options, consumer_timeout_note
from shared.service.jobs import TASK_NAME
from shared.service.replica import replica_name
from shared.service.watchdog import Watchdog, forget_heartbeat
from shared.settings import Settings, get_settings
from worker.runtime import Runtime
from worker.tasks import register
from worker.transport import transport_for

# Young-generation GC threshold of a worker process (Python's default: 700 allocations).
# Each job allocates thousands of short-lived containers (the transcript's messages, JSON,
# HTTP objects); at 700 the collector ran so often that it took ~9% of the worker's CPU.
GC_THRESHOLD = 20_000

# On RabbitMQ the consumer's event loop sleeps until its next timer, up to 10 s, and a SIGTERM
# does not wake it: a warm shutdown began up to 10 s late. A timer every second bounds that.
WAKE_S = 1.0

log = get_logger(__name__)


def restore_interval(visibility_timeout_s: int) -> int:
    """Seconds between sweeps for abandoned (unacked, timed-out) messages.

    kombu's default sweep runs about every 100 s; with a short visibility timeout that would
    dominate how long a crashed worker's task waits. A fifth of the timeout, 1 to 10 s.
    """
    return max(1, min(10, visibility_timeout_s // 5))


HEARTBEAT_S = 4  # see celery_config: a dead broker connection found within ~2 beats


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings derived from `settings` (pure: tests inspect it)."""
    queue = settings.summary_queue
    shared = celery_options(settings, "worker")  # as the API's publisher declares and sends
    options = dict(shared.pop("broker_transport_options"))
    if broker_kind(settings.broker) == "redis":
        options["unacked_restore_interval"] = restore_interval(settings.visibility_timeout_s)
        options["unacked_restore_throttle"] = 1
        # a connection a broker restart or a network fault left half-open is found by a PING
        # on it within this, rather than redis-py's default 25 s
        options["health_check_interval"] = HEARTBEAT_S
    config: dict[str, Any] = {
        **shared,
        "broker_url": settings.broker,
        "broker_connection_retry_on_startup": True,
        # Celery gives up on the broker after 100 reconnects (~45 min) and the worker exits:
        # a worker outlives any outage instead (`prefit up` would restart it, others may not)
        "broker_connection_max_retries": None,
        # AMQP heartbeats every HEARTBEAT_S: a RabbitMQ that vanished without closing the
        # connection (a host or network fault) is found dead after two missed beats, not
        # Celery's default 120 s x 2; a killed one closes the socket and is found at once
        "broker_heartbeat": HEARTBEAT_S,
        "broker_transport_options": options,
        "task_default_queue": queue,
        "task_routes": {TASK_NAME: {"queue": queue}},
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_ignore_result": True,
        "task_store_errors_even_if_ignored": False,
        "worker_prefetch_multiplier": 1,
        # On a lost broker connection (RabbitMQ hands the unacknowledged tasks out again at
        # once) the running summaries finish: the lease and the records' SET NX make the
        # redelivered copies harmless, and their work is not wasted.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_pool": "threads",
        "worker_concurrency": settings.worker_concurrency,
        "worker_send_task_events": False,
        "worker_consumer": "worker.transport:Consumer",  # back on the broker within a second
        # After a reconnect with tasks running, Celery lowers the prefetch count and raises it
        # back as they finish; on RabbitMQ the worker could stay stuck at the lowered count and
        # take no task again (celery#9512, #7515; seen in bench/cluster_faults.py after F2).
        # Running tasks' deliveries come back anyway, and a lease makes any copy harmless.
        "worker_enable_prefetch_count_reduction": False,
        "task_send_sent_event": False,
    }
    transport = transport_for(settings.broker)
    if transport is not None:  # see worker/transport.py: survives Redis restarts under load
        config["broker_transport"] = transport
    return config


def make_app(
    settings: Settings | None = None, *, runtime: Runtime | None = None, main: str = "prefit"
) -> Celery:
    """A Celery app running `prefit.summarize` with `settings` (the process's by default).

    Pass a `runtime` to keep hold of its store (tests close it); else one is made.
    """
    chosen = settings if settings is not None else get_settings()
    celery = Celery(main, set_as_current=False)
    celery.conf.update(celery_config(chosen))
    register(celery, runtime if runtime is not None else Runtime(chosen))
    return celery


def check_consumer_timeout(consumer: Any, settings: Settings) -> None:
    """Warn once if the RabbitMQ this worker consumes from ignores the queue's consumer timeout
    (its deliveries would then be taken back after the server's own `consumer_timeout`)."""
    if broker_kind(settings.broker) != "amqp":
        return
    try:
        properties = consumer.connection.connection.server_properties
        version = properties.get("version", "")
    except AttributeError:  # not connected (yet): nothing to say
        return
    note = consumer_timeout_note(str(version), settings)
    if note is not None:
        log.warning("broker.consumer_timeout_ignored", note=note, server_version=str(version))


settings = get_settings()
runtime = Runtime(settings)
app = make_app(settings, runtime=runtime)


@celeryd_init.connect  # type: ignore[untyped-decorator]
def _configure_logging(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Structured logs for the command-line worker (in-process test workers keep theirs),
    before Celery checks its privileges (its SecurityWarning as root becomes one line) and
    in place of Celery's own logging set-up: its records go through structlog too."""
    if getattr(instance, "app", None) is app:
        configure_logging(json=settings.log_json, level=settings.log_level)
        forget_heartbeat(settings.heartbeat_file)  # this run has not beaten yet
        setup_logging.connect(_logging_is_ours, weak=False)


def _logging_is_ours(**_: Any) -> None:
    """A receiver of `setup_logging`: Celery then leaves the root logger as configured."""


@worker_init.connect  # type: ignore[untyped-decorator]
def _check_store(sender: Any = None, **_: Any) -> None:
    """Exit before taking a task when the store cannot work (a Redis Cluster node named
    without PREFIT_REDIS_CLUSTER, or the reverse)."""
    if getattr(sender, "app", None) is app:
        runtime.check_store()


@worker_ready.connect  # type: ignore[untyped-decorator]
def _on_ready(sender: Any = None, **_: Any) -> None:
    """Start the reaper; collect less often, and never again scan what the worker holds for good.

    `gc.freeze` moves every object alive now (modules, Celery, the app and its store) out of the
    collector's reach: later full collections only walk what jobs allocated.
    """
    if getattr(sender, "app", None) is app:
        runtime.start_reaper(app)  # an idle worker sends again what a dead one left behind
        check_consumer_timeout(sender, settings)
        quiet_celery_warnings()
        if sender.hub is not None:  # RabbitMQ: see WAKE_S
            sender.hub.call_repeatedly(WAKE_S, _nothing)
        if settings.worker_metrics_port is not None:
            runtime.metrics.serve(settings.worker_metrics_port, replica_name(settings))
        if settings.heartbeat_file is not None:
            watch(sender, WATCHDOG)
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


# Stops the worker when its consumer loop or its runtime's loop stops (on with a heartbeat file).
WATCHDOG = Watchdog(settings.watchdog_s, settings.heartbeat_file)
# A warm shutdown may take this long (docker-compose.yml's stop_grace_period for the worker).
SHUTDOWN_S = 90.0


def watch(consumer: Any, watchdog: Watchdog) -> None:
    """Watch `consumer`'s loop (a timer of its own beats: it fires only while the consumer runs
    and is connected to the broker) and the runtime's loop (poked), and start the watchdog."""
    if consumer.hub is not None:
        watchdog.watch("consumer")
        consumer.hub.call_repeatedly(watchdog.interval_s, watchdog.beat, "consumer")
    else:  # a transport without an event loop: only the runtime's loop is watched
        log.warning("watchdog.consumer_unwatched", detail="the broker's transport has no hub")
    watchdog.watch("runtime", runtime.poke_loop)
    watchdog.start()


def quiet_celery_warnings() -> None:
    """Python warnings as prefit's one-line `python.warned` again, and Celery's pending
    deprecations not at all.

    Celery's logging set-up turns `logging.captureWarnings` on (a warning becomes a multi-line
    formatted record) and asks for its deprecations `always`: after every reconnect to the
    broker it then warned about options this app sets on purpose (`broker_connection_retry`,
    `worker_cancel_long_running_tasks_on_connection_loss`), which tells an operator nothing.
    """
    logging.captureWarnings(False)  # gives back the `showwarning` configure_logging set
    warnings.filterwarnings("ignore", category=CPendingDeprecationWarning)


def _nothing() -> None:
    """A timer's callback: firing it is what wakes the event loop."""


@worker_shutting_down.connect  # type: ignore[untyped-decorator]
def _rest_watchdog(**_: Any) -> None:
    """A warm shutdown stops the consumer on purpose: the watchdog waits it out."""
    WATCHDOG.rest(SHUTDOWN_S)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _close_runtime(sender: Any = None, **_: Any) -> None:
    """Close the summarizer's connections and the store once the worker has stopped."""
    if getattr(sender, "app", None) is app:
        WATCHDOG.stop()
        runtime.close()
