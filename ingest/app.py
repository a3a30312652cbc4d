"""The ingest service's HTTP/WebSocket API (FastAPI) and its process entry.

* ``GET /openapi.json``, ``/docs`` (Swagger UI), ``/redoc`` - open, served offline
  (:mod:`framerelay.openapi_docs`, :mod:`ingest.api_docs`).
* ``GET /healthz`` - liveness; ``GET /readyz`` - 200 once the streams are
  loaded and started, else 503. Both open.
* the stream API (:mod:`ingest.streams_api`): ``GET /v1/streams`` ...
  (``streams:read`` / ``streams:write``).
* the routing API (:mod:`ingest.routing`): ``PUT /v1/streams/{id}/worker``
  (``routing:write``), ``GET /v1/routing`` (``streams:read``).
* ``POST /v1/rtt`` (:mod:`ingest.rtt_probe`): the round trip to a worker, measured
  with pings on a tunnel to it (``routing:write``), for latency-aware placement.
* ``GET /v1/history`` (:mod:`ingest.history`): the last hour of fps, drops and
  latency, per stream and in total (``streams:read``).
* the result hub (:mod:`ingest.hub`): ``WS /v1/results?stream=ID``
  (``results:<id>``).
* the operator console (:mod:`ingest.console`): ``GET /console`` (open, no data),
  its event streams under ``/v1/console/`` (``streams:read``, ``results:<id>``).
* ``GET /metrics`` - Prometheus: streams (:mod:`ingest.metrics`), hub, Redis
  publisher, ``framerelay_ingest_auth_refused_total{reason}``. Open unless
  ``metrics_auth`` (then ``metrics:read``).

Request bodies are capped at ``max_body_bytes`` (default 1 MiB): a larger
``Content-Length`` is a 413 before anything else (the token is not checked); a
chunked body is a 413 once the route reads past the limit, and routes check
their token before reading (:mod:`framerelay.web_limits`).

Tokens are for audience ``framerelay-ingest`` (:mod:`ingest.auth`); without
keys to verify them the API does not start. With ``api_tls_cert`` the API is
HTTPS/WSS only (:mod:`ingest.server`).

With ``FRAMERELAY_REDIS_URL`` set, results also go to Redis
(:mod:`ingest.redis_bus`): live PUBLISH and durable Streams.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from framerelay.auth import AuthGuard
from framerelay.auth.web import ApiAuth, install_validation_handler
from framerelay.lifecycle import install_signal_handlers, startup_heap_frozen
from framerelay.openapi_docs import install_docs
from framerelay.startup import bind_error
from framerelay.web_limits import BodyLimit
from ingest import api_docs
from ingest.auth import api_guard
from ingest.console import console_router
from ingest.console_fleet import fleet_router
from ingest.console_jobs import jobs_router
from ingest.history import HistorySampler, history_router
from ingest.hub import ResultHub, build_hub, results_router
from ingest.jsonl import JsonlWriter
from ingest.metrics import register_stream_metrics
from ingest.ready import ready_once
from ingest.redis_bus import publisher_from_settings
from ingest.routing import routing_router
from ingest.rtt_probe import RttProber, rtt_router
from ingest.server import api_server, tls_options
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import build_store
from ingest.streams_api import streams_router

log = logging.getLogger(__name__)


def create_app(
    service: IngestService,
    hub: ResultHub | None = None,
    registry: CollectorRegistry | None = None,
    *,
    guard: AuthGuard | None = None,
    history: HistorySampler | None = None,
) -> FastAPI:
    """The ingest API. ``guard`` checks every token (default: the hub's, else one built
    from the settings); ConfigError when there are no keys to verify tokens with."""
    app = FastAPI(title="framerelay ingest", version="1", docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    registry = registry or CollectorRegistry()
    guard = guard or (hub.guard if hub is not None else api_guard(service.settings, registry))
    hub = hub or build_hub(service.bus, service.settings, registry, guard=guard)
    api = ApiAuth(guard)
    register_stream_metrics(service, registry)  # stream state/counters (ingest.metrics)
    install_validation_handler(app)  # 422s never echo submitted values (passwords)
    app.add_middleware(BodyLimit, max_bytes=service.settings.max_body_bytes,
                       setting="FRAMERELAY_INGEST_MAX_BODY_BYTES")  # fmt: skip
    app.include_router(_metrics_router(registry, api if service.settings.metrics_auth else None))

    # open /openapi.json, /docs and /redoc, offline (framerelay.openapi_docs)
    install_docs(app, api_docs.SECURITY, {"/v1/results": api_docs.RESULTS_WEBSOCKET},
                 api_docs.MODELS)  # fmt: skip

    @app.get("/healthz", summary="Liveness", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Answers while the process runs."""
        return {"status": "ok"}

    starting: dict[int | str, dict[str, Any]] = {503: {"description": "Starting: not loaded yet"}}

    @app.get("/readyz", summary="Readiness", tags=["health"], responses=starting)
    async def readyz() -> Response:
        """200 once the stored streams are loaded and started, else 503."""
        ready = service.started.is_set()
        body = b'{"status":"ready"}' if ready else b'{"status":"starting"}'
        return Response(body, status_code=200 if ready else 503, media_type="application/json")

    app.include_router(streams_router(service, api))
    app.include_router(routing_router(service, api))
    app.include_router(rtt_router(RttProber.of(service.settings), api))  # issue 18
    history = history if history is not None else HistorySampler()  # sampled by serve_ingest
    app.include_router(history_router(history, service.streams, api))
    app.include_router(results_router(hub))
    app.include_router(console_router(service, api))
    app.include_router(fleet_router(service.settings, api))  # the console's fleet panel
    app.include_router(jobs_router(service.settings, api))  # the console's jobs panel
    return app


def _metrics_router(registry: CollectorRegistry, api: ApiAuth | None) -> APIRouter:
    """``GET /metrics``: open, or (``api`` given) for tokens granting ``metrics:read``."""
    router = APIRouter()
    scrape = [api.requires("metrics:read")] if api is not None else []

    @router.get("/metrics", dependencies=scrape, summary="Prometheus metrics", tags=["health"],
                response_class=PlainTextResponse)  # fmt: skip
    async def metrics() -> Response:
        """Prometheus text: streams, tunnels, result hub, Redis publisher, refusals."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router


async def serve_ingest(settings: IngestSettings) -> int:
    """Run the ingest service and its API until SIGINT/SIGTERM."""
    registry = CollectorRegistry()
    guard = api_guard(settings, registry)  # refuses to start without keys to verify tokens
    tls_options(settings)  # and with a TLS file it cannot read
    store = build_store(settings)  # streams added over the API survive restarts
    service = IngestService(settings, store=store)
    writer = JsonlWriter(settings.out) if settings.out else None
    if writer is not None:
        service.bus.tap(writer.write)
    service.bus.resize_history(settings.results.history, settings.results.history_s)
    publisher = publisher_from_settings(settings, service.bus.ids, registry)
    if publisher is not None:
        service.bus.observe(publisher.offer)
    durable = publisher.read_after if publisher else None
    hub = build_hub(service.bus, settings, registry, durable, guard=guard)
    stop = asyncio.Event()
    history = HistorySampler()  # the last hour, for GET /v1/history (sampled while we run)
    try:
        app = create_app(service, hub, registry, guard=guard, history=history)
        server, sock = api_server(app, settings)
    except OSError as exc:
        where = "--api-port / FRAMERELAY_INGEST_API_PORT"
        raise bind_error(exc, settings.api_host, settings.api_port, where) from None
    install_signal_handlers(stop)
    # uvicorn captures SIGINT/SIGTERM while it serves and re-raises them when it
    # returns; whichever side ends first stops the other.
    api = asyncio.create_task(server.serve(sockets=[sock]), name="ingest-api")
    # result ids continue above what Redis holds: primed once the stream store is read
    # (a store that cannot be read is the one line the ingest exits with)
    prime = publisher.prime if publisher is not None else None
    started = ready_once(settings, sock, store, prime)  # the ready line: once all loaded
    run = asyncio.create_task(service.run(stop, before_streams=started), name="ingest-service")
    sampling = asyncio.create_task(history.run(service.streams, stop), name="ingest-history")
    flushed = asyncio.Event()  # the publisher stops after the last results came in
    redis = asyncio.create_task(publisher.run(flushed)) if publisher is not None else None
    try:
        with startup_heap_frozen():
            await asyncio.wait({api, run}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(api, run, sampling, return_exceptions=True)
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
