"""The demo's operator console: the ingest API on this machine, and a token to sign in with.

``framerelay demo`` serves the ingest API (and so the console, ``/console``) on
127.0.0.1 only. It mints one token for the console (streams:read,
streams:write, results:*; valid :data:`TOKEN_TTL_S`) with the demo's own
random secret and writes it to a file only this user can read; the token is
never printed (terminals and CI logs keep what they print). The file goes when
the demo ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

DEFAULT_PORT = 8080
TOKEN_TTL_S = 12 * 3600.0
SCOPES = ("streams:read", "streams:write", "results:*")
STOP_TIMEOUT_S = 5.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def write_token(secret: str) -> Path:
    """A console token in a new private folder (0700) as ``console-token`` (0600)."""
    from framerelay.auth import KeySet, TokenIssuer

    token = TokenIssuer(KeySet.from_secrets([secret])).mint(
        "demo-console", SCOPES, TOKEN_TTL_S, aud="ingest"
    )
    folder = Path(tempfile.mkdtemp(prefix="framerelay-demo-"))
    path = folder / "console-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def _bind(app: Any, settings: Any, port: int) -> tuple[Any, Any]:
    """The API server on ``port``; on any free port, said, when that one is taken."""
    from ingest.server import api_server

    try:
        return api_server(app, settings.model_copy(update={"api_port": port}))
    except OSError as exc:
        if port == 0:
            raise
        _say(f"console: port {port} is taken ({exc.strerror}); using a free port instead")
        return api_server(app, settings.model_copy(update={"api_port": 0}))


@contextlib.asynccontextmanager
async def serving_console(service: Any, secret: str, port: int) -> AsyncIterator[str]:
    """Serve ``service``'s API (with the console) while the demo runs; yields its URL."""
    from prometheus_client import CollectorRegistry

    from ingest.app import create_app
    from ingest.auth import api_guard
    from ingest.history import HistorySampler
    from ingest.hub import build_hub

    settings = service.settings
    registry = CollectorRegistry()
    guard = api_guard(settings, registry)
    hub = build_hub(service.bus, settings, registry, guard=guard)
    history = HistorySampler()  # the console's last-hour charts
    app = create_app(service, hub, registry, guard=guard, history=history)
    server, sock = _bind(app, settings, port)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/console"
    task = asyncio.create_task(server.serve(sockets=[sock]), name="demo-console")
    stop = asyncio.Event()
    sampling = asyncio.create_task(history.run(service.streams, stop), name="demo-history")
    token = write_token(secret)
    _say(f"console: {url} (sign in with the token in {token}; it is valid 12 h)")
    try:
        yield url
    finally:
        stop.set()
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(task, sampling), STOP_TIMEOUT_S)
        shutil.rmtree(token.parent, ignore_errors=True)
