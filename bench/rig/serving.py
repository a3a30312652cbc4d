"""Serve an ASGI app on 127.0.0.1 in a thread, for the contract servers the tests and
benches start in-process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

START_S = 10.0
"""How long the server has to start listening."""
SHUTDOWN_S = 5.0
"""How long open responses (a log stream) have to finish once the server is asked to stop."""


@contextmanager
def serve_in_thread(app: Any, what: str) -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields the port."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=int(SHUTDOWN_S),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=what)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"{what} did not start within {START_S:.0f} s")
        time.sleep(0.01)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(SHUTDOWN_S * 2)
