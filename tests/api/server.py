"""A real uvicorn server on a free loopback port (for end-to-end tests): in a thread of the
test process, or the API's own command line in a process of its own."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette

from shared.commands.redisproc import free_port
from shared.commands.up import api_argv
from tests.conftest import ROOT

START_TIMEOUT_S = 10.0
PROCESS_START_TIMEOUT_S = 30.0  # a cold interpreter imports FastAPI, Celery, tiktoken


@contextmanager
def serve(app: Starlette, host: str = "127.0.0.1") -> Iterator[str]:
    """Run `app` (the API or a fake provider) under uvicorn, bound to `host`, until the block
    ends; yields its base URL on 127.0.0.1."""
    port = free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)


@contextmanager
def serve_process(env: Mapping[str, str], log: Path) -> Iterator[str]:
    """Run the API's command line (`api.app:app` under uvicorn, configured by `env` alone) as a
    child process until the block ends; yields its base URL once `/healthz` answers."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            api_argv("127.0.0.1", port), cwd=ROOT, env=dict(env), stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start on port {port}: see {log}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False
