"""The orchestrator's API: place streams on workers, move them live, stop them.

The streams and their tunnels live in :class:`ingest.registry.StreamRegistry`
(moves, snapshots and failover are described there); ``routing_router``
exposes placement to the orchestrator:

* ``PUT /v1/streams/{id}/worker`` ``{"worker_id", "url", "stream"?,
  "tls_server_name"?}`` - place or move a stream, whichever worker serves it
  now, the default one included (``stream``: its definition, to create it if
  new; ``tls_server_name``: the name the worker's certificate must carry,
  e.g. ``<pod>.pods.framerelay``, checked against the ingest's ``tls_ca``);
  idempotent: naming the worker a stream is on changes nothing. Scope
  ``routing:write``. A ``ws://`` URL to a host that is not this one is
  refused (422) unless ``allow_insecure_workers``; ``worker_id`` ``default``
  names the default worker, at its own address only (else 422).
* ``DELETE /v1/streams/{id}/worker`` - stop a stream served by a worker other
  than the default one and forget it (``routing:write``); 404 otherwise.
* ``GET /v1/routing`` - stream -> worker id, for every stream served by a
  worker other than the default one (``streams:read``); ``GET /v1/workers``
  lists every tunnel, the default one too, with its streams.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from framerelay.auth.tokens import WORKER_ID
from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.errors import ConfigError, SourceError
from framerelay.openapi_docs import errors
from ingest.auth import HOSTNAME
from ingest.registry import UnknownStream
from ingest.service import IngestService
from ingest.settings import StreamConfig


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    worker_id: str = Field(
        pattern=WORKER_ID,
        description="The worker's name (letters, digits, ._-; never * or a pattern): the "
        "ingest mints this worker's tunnel token from it.",
    )
    url: str = Field(pattern=r"^wss?://", max_length=2048)
    stream: StreamConfig | None = None
    tls_server_name: str | None = Field(
        None,
        pattern=HOSTNAME,
        max_length=253,
        description="The DNS name the worker's certificate must carry (wss:// only), "
        "e.g. <pod>.pods.framerelay; default: the URL's host.",
    )


def routing_router(service: IngestService, api: ApiAuth) -> APIRouter:
    """The orchestrator's endpoints, on ``service``'s stream registry."""
    router = APIRouter(route_class=AuthFirstRoute)
    write = [api.requires("routing:write")]

    @router.put("/v1/streams/{stream_id}/worker", dependencies=write, tags=["routing"],
                summary="Place or move a stream on a worker",
                responses=errors(404, e404="No such stream, and no definition given"))  # fmt: skip
    async def assign(stream_id: str, body: Assignment) -> dict[str, Any]:
        """The orchestrator's: place the stream on the worker, live, with its tracker
        snapshot (idempotent); ``stream`` creates it if new."""
        try:
            moved = await service.place_stream(stream_id, body.worker_id, body.url,
                                               body.tls_server_name, body.stream)  # fmt: skip
        except UnknownStream as exc:
            raise HTTPException(404, str(exc)) from None
        except (ConfigError, SourceError) as exc:
            raise HTTPException(422, str(exc)) from None
        return {"stream": stream_id, "worker_id": body.worker_id, "changed": moved}

    @router.delete("/v1/streams/{stream_id}/worker", dependencies=write, tags=["routing"],
                   summary="Stop a placed stream",
                   responses=errors(404, e404="No placed stream with this id"))  # fmt: skip
    async def unassign(stream_id: str) -> dict[str, Any]:
        """The orchestrator's: stop a stream it placed on a worker and forget it."""
        try:
            await service.unplace_stream(stream_id)
        except UnknownStream:
            raise HTTPException(404, f"unknown stream {stream_id!r}") from None
        return {"stream": stream_id, "removed": True}

    @router.get("/v1/routing", dependencies=[api.requires("streams:read")], tags=["routing"],
                summary="Placed streams and their workers")  # fmt: skip
    async def routing() -> dict[str, str]:
        """Stream id -> worker id, for every stream placed by the orchestrator."""
        return service.registry.placed()

    return router
