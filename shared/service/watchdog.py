"""A process's watchdog: it ends a process whose loops stopped, and keeps a heartbeat file.

The file lets something outside end a process that cannot end itself.

A process names its loops (the API: uvicorn's event loop; a worker: Celery's consumer loop and
the runtime's event loop). Every `interval_s` the watchdog's thread pokes each one (asks it to
run a callback that beats); a loop that has not beaten for `stall_s` is stuck (blocked, or
waiting for a broker that does not come back), and the process logs `watchdog.stalled` and
exits with `STALLED_EXIT`, so its supervisor (Docker's restart policy, `prefit up`) starts it
again. While every loop beats, the thread rewrites the heartbeat file with the process's pid
and the time (epoch seconds) after which it is to be taken as stuck (and its start time, so an
earlier run's file never names a process of this one).

A process stopped whole (SIGSTOP, a debugger, a frozen VM page) runs no thread at all: it
neither beats nor exits. Its heartbeat file then ages past that deadline, and a check from
outside (the container's healthcheck in docker-compose.yml) kills the pid it names, which a
restart policy brings back. The deadline is in the file, so the check needs no setting.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shared.logs import get_logger

log = get_logger(__name__)

STALLED_EXIT = 70  # EX_SOFTWARE: the process gave up on itself
# A poke: run this callback on your loop when you can (a loop that runs calls it soon).
Poke = Callable[[Callable[[], None]], object]


def process_start(pid: int | str = "self") -> str:
    """Field 22 of /proc/<pid>/stat (start time, in clock ticks after boot); "0" without /proc.
    The fields are counted after the command's closing parenthesis (a name may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def forget_heartbeat(path: Path | None) -> None:
    """At a process's start: remove the heartbeat an earlier run left (a restarted container
    keeps its /tmp, and its pid may be this one's), so nothing judges this run by it."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


class Watchdog:
    """A daemon thread watching named loops; see the module docstring."""

    def __init__(
        self,
        stall_s: float,
        heartbeat_file: Path | None = None,
        *,
        interval_s: float | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.stall_s = stall_s
        self.heartbeat_file = heartbeat_file
        self.interval_s = interval_s if interval_s is not None else min(5.0, stall_s / 6)
        self._exit = exit
        self._lock = threading.Lock()
        self._beats: dict[str, float] = {}
        self._pokes: dict[str, Poke] = {}
        self._stop = threading.Event()
        self._resting_until: float | None = None
        self._thread: threading.Thread | None = None

    def watch(self, name: str, poke: Poke | None = None) -> None:
        """Watch the loop `name`: poked every interval with `poke`, or beating on its own
        (`beat(name)` from a timer of the loop) when `poke` is None."""
        with self._lock:
            self._beats[name] = time.monotonic()
            if poke is not None:
                self._pokes[name] = poke

    def beat(self, name: str) -> None:
        """The loop `name` ran just now."""
        with self._lock:
            self._beats[name] = time.monotonic()

    def start(self) -> None:
        """Start the thread (once) and write the first heartbeat."""
        if self._thread is None:
            self._write(time.monotonic())
            self._thread = threading.Thread(target=self._run, name="prefit-watchdog", daemon=True)
            self._thread.start()

    def rest(self, seconds: float) -> None:
        """Stop judging for `seconds` (a warm shutdown: the loops wind down on purpose); the
        heartbeat file's deadline is pushed past them."""
        with self._lock:
            self._resting_until = time.monotonic() + seconds
        self._write(time.monotonic())

    def stop(self) -> None:
        """Stop the thread and remove the heartbeat file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        if self.heartbeat_file is not None:
            with contextlib.suppress(OSError):
                self.heartbeat_file.unlink()

    def stalled(self, now: float) -> list[str]:
        """The loops that have not beaten for `stall_s`, at monotonic time `now`."""
        with self._lock:
            if self._resting_until is not None and now < self._resting_until:
                return []
            return sorted(n for n, at in self._beats.items() if now - at > self.stall_s)

    def check(self, now: float) -> None:
        """One round: exit if a loop stalled, else poke every loop and renew the heartbeat."""
        late = self.stalled(now)
        if late:
            quiet = {n: round(now - self._beats[n], 1) for n in late}
            log.error("watchdog.stalled", loops=late, quiet_s=quiet, limit_s=self.stall_s)
            self._exit(STALLED_EXIT)
            return
        with self._lock:
            pokes = list(self._pokes.items())
        for name, poke in pokes:
            try:
                poke(lambda name=name: self.beat(name))  # type: ignore[misc]
            except RuntimeError:  # the loop is closed: it ended on purpose, nothing to watch
                with self._lock:
                    self._pokes.pop(name, None)
                    self._beats.pop(name, None)
        self._write(now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check(time.monotonic())
            except Exception as exc:  # a watchdog that dies would look like a stuck process
                log.error("watchdog.failed", error=type(exc).__name__)

    def _deadline(self, now: float) -> float:
        """The wall-clock time after which this process is to be taken as stuck."""
        with self._lock:
            oldest = min(self._beats.values(), default=now)
            resting = self._resting_until
        until = max(oldest + self.stall_s, resting or 0.0)
        return time.time() + (until - now) + self.interval_s

    def _write(self, now: float) -> None:
        """`<pid> <deadline> <start>` into the heartbeat file, whole (a reader never sees
        half). `start` is the process's start time as /proc/<pid>/stat says it: a restarted
        container reuses pids (its app is pid 7 again), so the check kills `pid` only while it
        is still the process that wrote the line."""
        if self.heartbeat_file is None:
            return
        line = f"{os.getpid()} {int(self._deadline(now)) + 1} {process_start()}\n"
        target = self.heartbeat_file
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(fd, "w") as out:
                out.write(line)
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("watchdog.heartbeat_unwritten", path=str(target), error=str(exc))
