"""A real uvicorn server in a thread, on a free loopback port (for end-to-end tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette

from shared.redisproc import free_port

START_TIMEOUT_S = 10.0


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
