"""The ingest service in this event loop with its API over httpx's ASGI transport (no
socket), on a given stream store; no worker (the tunnel keeps retrying, streams run)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import StreamStore
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

SECRET = "not-a-real-secret-but-long-enough"


def _settings() -> IngestSettings:
    # a worker that is not there: once a stream exists the tunnel keeps retrying;
    # streams still run
    return IngestSettings(
        worker_url=f"ws://127.0.0.1:{free_port()}/v1/tunnel", token_secrets=SECRET
    )


@contextlib.asynccontextmanager
async def running(store: StreamStore) -> AsyncIterator[tuple[IngestService, httpx.AsyncClient]]:
    service = IngestService(_settings(), store=store)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    transport = httpx.ASGITransport(app=create_app(service))
    token = mint(SECRET, ["streams:read", "streams:write", "metrics:read"], "ingest", ttl=600)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://ingest", headers=headers
        ) as http:
            await wait_until_async(service.started.is_set, 10, "service start")
            yield service, http
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
