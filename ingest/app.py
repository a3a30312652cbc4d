"""The ingest service's HTTP/WebSocket API (FastAPI) and its process entry.

* ``GET /healthz`` - liveness.
* ``GET /v1/streams`` - every stream's state and counters.
* ``WS /v1/results?stream=ID`` - live results as JSON text messages. When token
  secrets are configured, the client must send ``Authorization: Bearer`` with a
  token granting ``stream:<id>`` for every stream it asks for. Each subscriber
  has a bounded queue (oldest dropped, counted in ``dropped``) and a send
  timeout, so a slow client never delays the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import uvicorn
from fastapi import FastAPI, Query, WebSocket, WebSocketDisconnect, status

from framerelay.auth import TokenSigner, bearer_token
from framerelay.errors import AuthError
from framerelay.lifecycle import install_signal_handlers
from framerelay.settings import split_secrets
from ingest.jsonl import JsonlWriter
from ingest.service import IngestService
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
SUBSCRIBER_QUEUE = 256
SEND_TIMEOUT_S = 5.0


def create_app(service: IngestService) -> FastAPI:
    signer = (
        TokenSigner(split_secrets(service.settings.token_secrets))
        if service.settings.token_secrets is not None
        else None
    )
    app = FastAPI(title="framerelay ingest", version="1")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/streams")
    async def streams() -> list[dict[str, Any]]:
        return [s.describe() for s in service.streams.values()]

    @app.websocket("/v1/results")
    async def results(ws: WebSocket, stream: list[str] = Query(default=[])) -> None:  # noqa: B008
        wanted = stream or list(service.streams)
        if signer is not None:
            try:
                token = bearer_token(ws.headers.get("authorization"))
                for sid in wanted:
                    signer.verify(token, f"stream:{sid}")
            except AuthError as exc:
                await ws.close(code=status.WS_1008_POLICY_VIOLATION, reason=str(exc)[:120])
                return
        await ws.accept()
        await _pump(ws, service, frozenset(wanted) if stream else None)

    return app


async def _pump(ws: WebSocket, service: IngestService, streams: frozenset[str] | None) -> None:
    sub = service.bus.subscribe(maxsize=SUBSCRIBER_QUEUE, streams=streams)
    try:
        while True:
            record = await sub.get()
            text = record.model_dump_json()
            if sub.dropped:
                text = text[:-1] + f',"dropped":{sub.dropped}}}'
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await ws.send_text(text)
    except (WebSocketDisconnect, TimeoutError, RuntimeError):
        pass
    finally:
        sub.close()
        with contextlib.suppress(RuntimeError):
            await ws.close()


async def serve_ingest(settings: IngestSettings) -> int:
    """Run the ingest service and its API until SIGINT/SIGTERM."""
    service = IngestService(settings)
    writer = JsonlWriter(settings.out) if settings.out else None
    if writer is not None:
        service.bus.tap(writer.write)
    stop = asyncio.Event()

    app = create_app(service)
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        access_log=False,
        lifespan="off",
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
