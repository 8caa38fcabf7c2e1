"""`prefit up`: the whole service on one machine, as supervised child processes.

An embedded redis-server (unless REDIS_URL is set), one Celery worker and the API. Each child
runs in a session of its own, so a terminal's Ctrl-C reaches only the supervisor, which then
stops the children in order (API first: no new jobs; then the worker, which finishes its
current tasks; then Redis). A child that dies is started again after 1 s, doubling to 30 s
while it keeps dying (reset once it has stayed up a minute); the others keep running, so the
API keeps answering while a worker comes back. Only SIGINT or SIGTERM stops `up`, and a
start that cannot work: a port it cannot listen on, or an API that exits `STARTUP_DEATHS` times
before it ever answers (a configuration it refuses, such as malformed PREFIT_API_KEYS).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, TextIO
from urllib.parse import urlsplit

import httpx
import structlog

from shared.commands.redisproc import RedisProcess, reachable
from shared.errors import ConfigError, PrefitError, StoreUnavailable
from shared.logs import UVICORN_LOG_CONFIG, get_logger
from shared.settings import Settings

log = get_logger(__name__)
READY_TIMEOUT_S = 60.0
STARTUP_DEATHS = 3  # the API dying this often before it first answers stops `up` (exit 2)


@dataclass(frozen=True)
class Backoff:
    """How long a dead child waits before its restart: `first_s`, doubling to `max_s`.

    A child that stayed up `stable_s` seconds starts again from `first_s` when it next dies.
    """

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0

    def delay(self, deaths: int) -> float:
        """The wait before restarting after the `deaths`-th death in a row (1, 2, ...)."""
        return float(min(self.max_s, self.first_s * 2.0 ** max(0, deaths - 1)))


class Child:
    """A named child process, and what it takes to start it again."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.proc = self._popen()
        self.started_at = time.monotonic()
        self.deaths = 0  # in a row: reset once the child has stayed up `Backoff.stable_s`
        self.restarts = 0
        self.restart_at: float | None = None  # set while dead and waiting for its restart

    def _popen(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # see `relay`; stderr (the log lines) is inherited
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.relay = threading.Thread(
            target=relay, args=(self.name, proc.stdout), name=f"prefit-{self.name}-stdout"
        )
        self.relay.daemon = True
        self.relay.start()
        return proc

    def drain(self) -> None:
        """Wait (briefly) until what the stopped child printed has been relayed."""
        self.relay.join(timeout=2.0)

    def restart(self) -> None:
        self.proc = self._popen()
        self.started_at = time.monotonic()
        self.restarts += 1
        self.restart_at = None


class Supervisor:
    """Named child processes, each restarted with backoff when it dies, until a stop request.

    Only `request_stop` (SIGINT or SIGTERM inside `signals()`) ends `watch`: a child that
    crashes is started again after `backoff.delay(...)` while the others keep running, so the
    API keeps answering while a worker comes back.
    """

    def __init__(
        self,
        *,
        grace_s: float = 10.0,
        poll_s: float = 0.2,
        backoff: Backoff | None = None,
        say: Callable[..., None] | None = None,
    ) -> None:
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.backoff = backoff if backoff is not None else Backoff()
        self.children: list[Child] = []
        self._say = say
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start a child in its own session (its own process group)."""
        child = Child(name, argv, env)
        self.children.append(child)
        log.info("service.child_started", child=name, pid=child.proc.pid)
        return child

    def request_stop(self, *_: Any) -> None:
        """Ask `watch` to return; safe to call from a signal handler."""
        self._stop.set()

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop while inside the block."""
        previous = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def watch(self) -> None:
        """Restart children as they die, with backoff, until a stop is requested."""
        while not self._stop.wait(self.poll_s):
            self.tend(time.monotonic())

    def tend(self, now: float) -> None:
        """One round of `watch`: note new deaths, restart the children whose wait is over."""
        for child in self.children:
            if child.proc.poll() is None:
                if now - child.started_at >= self.backoff.stable_s:
                    child.deaths = 0
            elif child.restart_at is None:
                child.deaths += 1
                wait = self.backoff.delay(child.deaths)
                child.restart_at = now + wait
                code = child.proc.returncode
                text = f"{child.name} exited with code {code}; restarting in {wait:g}s"
                fields = {"child": child.name, "code": code, "restart_in": wait}
                self._tell("service.child_exited", text, "warning", **fields)
            elif now >= child.restart_at:
                child.restart()
                text = f"{child.name} restarted (pid {child.proc.pid})"
                self._tell("service.child_restarted", text, child=child.name, pid=child.proc.pid)

    def stop(self) -> None:
        """Stop children newest first: SIGTERM their group, wait `grace_s`, then SIGKILL."""
        for child in reversed(self.children):
            _signal_group(child.proc, signal.SIGTERM)
            try:
                child.proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                log.warning("service.child_killed", child=child.name, pid=child.proc.pid)
            _signal_group(child.proc, signal.SIGKILL)  # stragglers of the group, if any
            child.proc.wait()
            child.drain()
            log.info("service.child_stopped", child=child.name, code=child.proc.returncode)

    def _tell(self, event: str, text: str, level: str = "info", **fields: Any) -> None:
        if self._say is not None:
            self._say(text, event, level, **fields)
        else:
            getattr(log, level)(event, **fields)


def relay(child: str, stream: IO[bytes] | None) -> None:
    """Copy a child's stdout to ours line by line: a structured log line as it is, any other
    (Celery's "Warm shutdown" notice) as one `service.child_printed` line, so the operator's
    stream stays one line per event in one format."""
    if stream is None:
        return
    with stream:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue
            if line.startswith("{") and line.endswith("}"):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            else:
                log.info("service.child_printed", child=child, text=line.strip())


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the supervisor itself is killed (no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# --- the command lines -----------------------------------------------------------------------


def worker_argv(
    settings: Settings, concurrency: int | None = None, name: str | None = None
) -> list[str]:
    """The Celery worker command line, for `prefit up`, `prefit worker` and containers.

    Each worker gets a node name of its own (`node_name`) unless `name` is given: two workers
    with one name share RabbitMQ's exclusive pidbox queue, and the second dies with
    RESOURCE_LOCKED.
    """
    return [
        sys.executable, "-m", "celery", "--quiet", "-A", "worker.app", "worker",  # no banner
        "-n", name or node_name(),
        "-Q", settings.summary_queue,
        "-P", "threads",
        "-c", str(concurrency or settings.worker_concurrency),
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-l", settings.log_level.upper(),
    ]  # fmt: skip


def node_name() -> str:
    """A Celery node name unique on this host: `prefit-<random>@%h` (Celery puts the host
    name for %h). Random rather than the pid: `up` restarts a worker under the same argv, and
    two containers may both be pid 1 on one host name."""
    return f"prefit-{secrets.token_hex(4)}@%h"


HTTP_PROTOCOL = "api.connections:GuardedHttpTools"  # by name: shared never imports the API


def api_argv(host: str, port: int, workers: int = 1) -> list[str]:
    """The uvicorn command line of the API (the API logs one line per request itself, and
    uvicorn's own lines are structured from the first: `UVICORN_LOG_CONFIG`). Its protocol
    closes connections that do not finish a request (header, body and idle timeouts of the
    settings: api/connections.py)."""
    argv = [sys.executable, "-m", "uvicorn", "api.app:app", "--host", host, "--port", str(port)]
    argv += ["--no-access-log", "--log-config", str(UVICORN_LOG_CONFIG), "--http", HTTP_PROTOCOL]
    return argv + (["--workers", str(workers)] if workers > 1 else [])


def describe_summarizer(settings: Settings) -> str:
    """Which summarizer the workers use, without credentials."""
    if not settings.summarizer_url:
        return "extractive (offline, no LLM; set PREFIT_SUMMARIZER_URL for a model)"
    where = urlsplit(_redact(settings.summarizer_url))._replace(query="", fragment="").geturl()
    model = settings.summarizer_model or "(default model)"
    return f"{settings.summarizer_protocol} {model} at {where}"


# --- `prefit up` -----------------------------------------------------------------------------


@dataclass(frozen=True)
class UpOptions:
    host: str
    port: int
    workers: int = 1  # API processes
    grace_s: float = 10.0
    redis_dir: Path | None = None
    backoff: Backoff = Backoff()
    summary_workers: int = 1  # Celery worker processes, each with a node name of its own


def run_up(opts: UpOptions, settings: Settings, env: Mapping[str, str], out: TextIO) -> int:
    """Run redis (maybe), the worker and the API until SIGINT or SIGTERM (0); 2 if it cannot start.

    A child that dies is restarted with backoff (`Backoff`); the others keep running.
    """
    sup = Supervisor(grace_s=opts.grace_s, backoff=opts.backoff, say=partial(_say, out))
    redis: RedisProcess | None = None
    with sup.signals(), metrics_dir(opts.workers) as metrics:
        try:
            check_listen(opts.host, opts.port)
            redis_url = settings.redis_url
            if "redis_url" not in settings.model_fields_set:
                if opts.redis_dir is not None:
                    _make_dir(opts.redis_dir)
                redis = RedisProcess(appendonly=opts.redis_dir is not None, dir=opts.redis_dir)
                redis_url = redis.start().url
            elif not _answers(redis_url):
                raise StoreUnavailable(f"REDIS_URL {_redact(redis_url)} does not answer PING")
            if not sup.stopping:
                child_env = {**env, "REDIS_URL": redis_url}
                for i in range(opts.summary_workers):
                    name = "worker" if opts.summary_workers == 1 else f"worker-{i + 1}"
                    sup.spawn(name, worker_argv(settings), child_env)
                api_env = child_env if metrics is None else {**child_env, METRICS_DIR: str(metrics)}
                sup.spawn("api", api_argv(opts.host, opts.port, opts.workers), api_env)
                _banner(out, opts, settings, redis_url, redis)
                if metrics is not None:
                    summed = f"/metrics sums the {opts.workers} API processes' files in {metrics}"
                    _say(out, summed, "service.metrics_shared")
                _wait_ready(sup, opts, out)
                sup.watch()
        except PrefitError as exc:
            _say(out, str(exc), "service.failed", "error", error=type(exc).__name__)
            return 2
        finally:
            _say(out, "stopping", "service.stopping")
            sup.stop()
            if redis is not None:
                redis.stop()
    return 0


def check_listen(host: str, port: int) -> None:
    """Raise `ConfigError` unless the API could listen on `host:port` now.

    Checked before anything starts: on a port another server holds, uvicorn would exit, be
    restarted over and over, and the readiness check would be answered by the other server.
    """
    if not 1 <= port <= 65535:
        raise ConfigError(f"port {port} is not a TCP port (1-65535): set --port or PREFIT_PORT")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (another `prefit up` or "
            "server there?); choose another with --port or PREFIT_PORT"
        ) from None


def _answers(redis_url: str) -> bool:
    """Whether the Redis of REDIS_URL answers PING; `ConfigError` for a URL that is not one."""
    try:
        return reachable(redis_url, timeout=2.0)
    except ValueError as exc:  # redis-py's refusal of the URL itself (scheme, port)
        raise ConfigError(f"REDIS_URL {_redact(redis_url)!r} is not a Redis URL: {exc}") from None


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--redis-dir {path}: cannot make the folder ({exc.strerror or exc})"
        ) from None


# prometheus_client's own variable: its children then keep their metrics in files there
METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def metrics_dir(api_processes: int) -> Iterator[Path | None]:
    """A new, empty directory for the API processes' metrics when there are several (removed
    when `up` ends), so that `/metrics` sums them; None for one process."""
    if api_processes <= 1:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="prefit-metrics-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _say(
    out: TextIO, text: str, event: str = "service.noted", level: str = "info", **kw: Any
) -> None:
    """One line for the operator on `out`, rendered as every other log line is (JSON, or
    readable columns on a terminal): `event`, the sentence as `detail`, and `kw`. Shown
    whatever PREFIT_LOG_LEVEL is, as `up`'s own word on what it started and where."""
    logger = structlog.wrap_logger(
        structlog.WriteLogger(out),
        processors=structlog.get_config()["processors"],
        wrapper_class=structlog.BoundLogger,  # not the level-filtering one
    )
    getattr(logger, level)(event, detail=text, **kw)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()


def _banner(
    out: TextIO, opts: UpOptions, settings: Settings, redis_url: str, redis: RedisProcess | None
) -> None:
    if redis is None:
        where = "from REDIS_URL"
    elif opts.redis_dir is None:
        where = "embedded redis-server, not persisted"
    else:
        where = f"embedded redis-server, AOF in {opts.redis_dir}"
    _say(
        out,
        f"API on http://{opts.host}:{opts.port} ({opts.workers} process(es))",
        "service.api_started",
    )
    _say(out, f"redis {_redact(redis_url)} ({where})", "service.redis_chosen")
    broker = _redact(settings.broker_url) if settings.broker_url else "the store's Redis"
    queue = f"queue {settings.summary_queue!r} on {broker}"
    workers = f"{opts.summary_workers} worker(s)"
    _say(
        out,
        f"{workers}: concurrency {settings.worker_concurrency} each, {queue}",
        "service.worker_started",
    )
    _say(out, f"summarizer: {describe_summarizer(settings)}", "service.summarizer_chosen")
    if not settings.models:
        _say(
            out,
            "warning: PREFIT_MODELS is empty: every model is unknown, so requests must give "
            "max_input_tokens and the proxy routes forward everything unfitted; set e.g. "
            'PREFIT_MODELS=\'{"gpt-4o": {"max_input_tokens": 128000}}\'',
            "service.models_missing",
            "warning",
        )


def _wait_ready(sup: Supervisor, opts: UpOptions, out: TextIO) -> None:
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "::", "") else opts.host
    url = f"http://{host}:{opts.port}/healthz"
    deadline = time.monotonic() + READY_TIMEOUT_S
    api = next(c for c in sup.children if c.name == "api")
    while not sup.stopping and time.monotonic() < deadline:
        sup.tend(time.monotonic())  # a child dying while starting is restarted meanwhile
        if api.deaths >= STARTUP_DEATHS:  # never answered: its configuration, not bad luck
            raise ConfigError(
                f"the API exited {api.deaths} times before it answered (last exit code "
                f"{api.proc.returncode}); its error is printed above"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                _say(out, f"ready at http://{host}:{opts.port} (Ctrl-C to stop)", "service.ready")
                return
        time.sleep(sup.poll_s)
    if not sup.stopping:
        late = f"{url} did not answer within {READY_TIMEOUT_S:.0f}s; still waiting"
        _say(out, late, "service.not_ready", "warning")
