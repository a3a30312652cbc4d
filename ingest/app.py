"""The ingest service's HTTP/WebSocket API (FastAPI) and its process entry.

* ``GET /healthz`` - liveness.
* the stream API (:mod:`ingest.streams_api`): ``GET /v1/streams`` ...
* the result hub (:mod:`ingest.hub`): ``WS /v1/results?stream=ID``.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from fastapi import FastAPI

from framerelay.lifecycle import install_signal_handlers
from ingest.hub import results_router
from ingest.jsonl import JsonlWriter
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.streams_api import streams_router

log = logging.getLogger(__name__)


def create_app(service: IngestService) -> FastAPI:
    app = FastAPI(title="framerelay ingest", version="1")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(streams_router(service))
    app.include_router(results_router(service))
    return app


async def serve_ingest(settings: IngestSettings) -> int:
    """Run the ingest service and its API until SIGINT/SIGTERM."""
    service = IngestService(settings)
    writer = JsonlWriter(settings.out) if settings.out else None
    if writer is not None:
        service.bus.tap(writer.write)
    stop = asyncio.Event()
    config = uvicorn.Config(
        create_app(service),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    install_signal_handlers(stop)
    # uvicorn captures SIGINT/SIGTERM while it serves and re-raises them when it
    # returns; whichever side ends first stops the other.
    api = asyncio.create_task(server.serve(), name="ingest-api")
    run = asyncio.create_task(service.run(stop), name="ingest-service")
    try:
        await asyncio.wait({api, run}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(api, run, return_exceptions=True)
        if writer is not None:
            writer.close()
    return 0
