"""The ingest's ready line: where its API listens and what it loaded."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

from framerelay.redact import redact_url
from framerelay.startup import announce_ready
from ingest.settings import IngestSettings
from ingest.store import FileStore, RedisStore, StreamStore


def _store(store: StreamStore, settings: IngestSettings) -> str:
    if isinstance(store, FileStore):
        return f"stream store {store.path}"
    if isinstance(store, RedisStore):
        return f"stream store Redis hash {store.key}"
    return "no stream store"


def announce(settings: IngestSettings, sock: socket.socket, store: StreamStore) -> None:
    """Log ``ingest listening on <url>; <streams, worker, store, results>`` (no secrets)."""
    host, port = sock.getsockname()[:2]
    scheme = "https" if settings.api_tls_cert is not None else "http"
    host = f"[{host}]" if ":" in str(host) else host
    results = "results to Redis" if settings.redis_url is not None else "results in memory"
    if settings.out is not None:
        results += f" and {settings.out}"
    loaded = (
        f"{len(settings.streams)} configured stream(s), {_store(store, settings)}, "
        f"worker {redact_url(settings.worker_url)}, {results}"
    )
    announce_ready("ingest API", f"{scheme}://{host}:{port}", loaded)


def ready_once(
    settings: IngestSettings,
    sock: socket.socket,
    store: StreamStore,
    then: Callable[[], Awaitable[object]] | None,
) -> Callable[[], Awaitable[None]]:
    """A ``before_streams`` hook: ``then`` (if any), then the ready line, so a store or a
    Redis that cannot be read is the one line the ingest exits with, not after a ready line."""

    async def hook() -> None:
        if then is not None:
            await then()
        announce(settings, sock, store)

    return hook
