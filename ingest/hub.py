"""Result hub: the WebSocket API that fans results out to subscribers.

``WS /v1/results?stream=ID`` sends live results as JSON text messages. When
token secrets are configured, the client must send ``Authorization: Bearer``
with a token granting ``stream:<id>`` for every stream it asks for. Each
subscriber has a bounded queue (oldest dropped, counted in ``dropped``) and a
send timeout, so a slow client never delays the others.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect, status

from framerelay.auth import TokenSigner, bearer_token
from framerelay.errors import AuthError
from framerelay.settings import split_secrets
from ingest.bus import Subscription
from ingest.service import IngestService

SUBSCRIBER_QUEUE = 256
SEND_TIMEOUT_S = 5.0


def results_router(service: IngestService) -> APIRouter:
    secrets = service.settings.token_secrets
    signer = TokenSigner(split_secrets(secrets)) if secrets is not None else None
    router = APIRouter()

    @router.websocket("/v1/results")
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

    return router


async def _pump(ws: WebSocket, service: IngestService, streams: frozenset[str] | None) -> None:
    """Send results until the client leaves; a reader notices it leaving at once."""
    sub = service.bus.subscribe(maxsize=SUBSCRIBER_QUEUE, streams=streams)
    sender = asyncio.create_task(_send(ws, sub))
    reader = asyncio.create_task(_drain_client(ws))
    try:
        await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, reader):
            task.cancel()
        await asyncio.gather(sender, reader, return_exceptions=True)
        sub.close()
        with contextlib.suppress(RuntimeError):
            await ws.close()


async def _send(ws: WebSocket, sub: Subscription) -> None:
    with contextlib.suppress(WebSocketDisconnect, TimeoutError, RuntimeError):
        while True:
            record = await sub.get()
            text = record.model_dump_json()
            if sub.dropped:
                text = text[:-1] + f',"dropped":{sub.dropped}}}'
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await ws.send_text(text)


async def _drain_client(ws: WebSocket) -> None:
    """Subscribers send nothing we act on; return when they disconnect."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
