"""The ingest service's HTTP/WebSocket API (FastAPI) and its process entry.

* ``GET /healthz`` - liveness.
* the stream API (:mod:`ingest.streams_api`): ``GET /v1/streams`` ...
* the result hub (:mod:`ingest.hub`): ``WS /v1/results?stream=ID``.
* ``GET /metrics`` - Prometheus: streams (:mod:`ingest.metrics`), hub, Redis publisher.

With ``FRAMERELAY_REDIS_URL`` set, results also go to Redis
(:mod:`ingest.redis_bus`): live PUBLISH and durable Streams.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from framerelay.lifecycle import install_signal_handlers, startup_heap_frozen
from ingest.hub import ResultHub, api_server, build_hub, results_router
from ingest.jsonl import JsonlWriter
from ingest.metrics import register_stream_metrics
from ingest.redis_bus import publisher_from_settings
from ingest.routing import routing_router
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import build_store
from ingest.streams_api import install_validation_handler, streams_router

log = logging.getLogger(__name__)


def create_app(
    service: IngestService,
    hub: ResultHub | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    app = FastAPI(title="framerelay ingest", version="1")
    registry = registry or CollectorRegistry()
    hub = hub or build_hub(service.bus, service.settings, registry)
    register_stream_metrics(service, registry)  # stream state/counters (ingest.metrics)
    install_validation_handler(app)  # 422s never echo submitted values (passwords)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(streams_router(service))
    app.include_router(routing_router(service.pool, adopt=service.adopt_stream))
    app.include_router(results_router(hub))
    return app


async def serve_ingest(settings: IngestSettings) -> int:
    """Run the ingest service and its API until SIGINT/SIGTERM."""
    store = build_store(settings)  # streams added over the API survive restarts
    service = IngestService(settings, store=store)
    writer = JsonlWriter(settings.out) if settings.out else None
    if writer is not None:
        service.bus.tap(writer.write)
    service.bus.resize_history(settings.results.history)
    registry = CollectorRegistry()
    publisher = publisher_from_settings(settings, service.bus.ids, registry)
    if publisher is not None:
        service.bus.observe(publisher.offer)
    hub = build_hub(service.bus, settings, registry, publisher.read_after if publisher else None)
    stop = asyncio.Event()
    server, sock = api_server(create_app(service, hub, registry), settings)
    install_signal_handlers(stop)
    # uvicorn captures SIGINT/SIGTERM while it serves and re-raises them when it
    # returns; whichever side ends first stops the other.
    api = asyncio.create_task(server.serve(sockets=[sock]), name="ingest-api")
    run = asyncio.create_task(service.run(stop), name="ingest-service")
    flushed = asyncio.Event()  # the publisher stops after the last results came in
    redis = asyncio.create_task(publisher.run(flushed)) if publisher is not None else None
    try:
        with startup_heap_frozen():
            await asyncio.wait({api, run}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(api, run, return_exceptions=True)
        flushed.set()
        if redis is not None and publisher is not None:
            await asyncio.gather(redis, return_exceptions=True)
            await publisher.aclose()
        if writer is not None:
            writer.close()
        await store.close()
    failure = run.exception() if run.done() and not run.cancelled() else None
    if failure is not None:  # e.g. the stream store cannot be read: say so, exit non-zero
        raise failure
    return 0
