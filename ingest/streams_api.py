"""Stream management REST API (OpenAPI at ``/openapi.json``).

* ``GET /v1/streams`` - every stream with its state and counters;
* ``POST /v1/streams`` - add a stream (a :class:`StreamConfig`): 201, or 409
  when the id exists;
* ``GET /v1/streams/{id}`` - one stream: state, counters, its definition
  (credentials masked) and its recent state changes;
* ``PUT /v1/streams/{id}`` - replace its definition; the stream restarts with
  it in the next epoch;
* ``DELETE /v1/streams/{id}`` - stop it and free its state (ingest and worker);
* ``GET /v1/workers`` - every worker tunnel (the default one first, then the
  orchestrator's): its state (IDLE, CONNECTING, UP, STALLED, DOWN), why it
  stalled, the age of its last result and heartbeat, its streams, stalls.

All of them read the one stream registry (:mod:`ingest.registry`), so they
agree: a stream listed by ``/v1/streams`` is served by the tunnel that lists
it in ``/v1/workers`` (and by the worker ``/v1/routing`` names, when placed).

Reading needs a token granting ``streams:read``, changing one granting
``streams:write`` (audience ``framerelay-ingest``); a refused request (401,
403, 429) has no effect. Definitions are validated (unknown fields are
errors: 422) and persisted before anything changes (store down: 503). A source
is held to :mod:`ingest.source_policy` too (422): a local file only under
``file_roots``, no host in ``source_denied_networks``. Validation errors never
echo the submitted values (they may hold a password).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import BaseModel, ConfigDict, Field

from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.errors import ConfigError, SourceError
from framerelay.openapi_docs import errors
from ingest.registry import StreamExists, UnknownStream
from ingest.service import IngestService
from ingest.settings import StreamConfig
from ingest.source_policy import api_source_problem
from ingest.store import StoreError
from ingest.stream import IngestStream

T = TypeVar("T")
CHANGE = {
    "e404": "No stream with this id",
    "e409": "A stream with this id exists",
    "e503": "The stream store cannot be written: nothing changed",
}


class StreamStatus(BaseModel):
    """State and counters of one stream (see the README for each counter)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    source: str = Field(description="The URL without credentials.")
    state: str = Field(
        description="STARTING, RUNNING, RECONNECTING, STALLED, AUTH_FAILED, STOPPED or FAILED."
    )
    state_since: float = Field(description="Unix time of the last state change.")
    error: str | None = Field(description="What is wrong now (RECONNECTING, FAILED).")
    stalled: str | None = Field(
        None, description="Why the worker serving it is not answering (STALLED)."
    )
    last_error: str | None
    epoch: int
    codec: str | None
    source_fps: float
    last_frame_age_s: float | None
    lag_s: float | None = Field(description="Live: how far decoding is behind the source.")
    credits: int
    inflight: int
    latency_slo_ms: float | None = Field(None, description="The stream's latency objective.")
    latency_from: str = Field(
        "decode",
        description="The clock the last result's latency was measured from: 'capture' (the "
        "camera's, from RTCP sender reports: RTSP) or 'decode' (the ingest's, at decode).",
    )
    latency_p50_ms: float | None = Field(
        None, description="Median end-to-end latency of the last 256 results."
    )
    latency_p99_ms: float | None = Field(None, description="99th percentile of the same.")
    slo_breaches: int = Field(0, description="Results later than latency_slo_ms.")
    decoded: int
    no_pts: int
    sampled_out: int
    no_credit: int
    prepared: int
    sent: int
    results: int
    replaced: int
    decode_error: int
    encode_error: int
    disconnected: int
    timeout: int
    worker_error: int
    corrupt: int
    behind: int
    open_error: int
    stall: int
    source_lost: int
    reconnects: int
    auth_failed: int = 0
    size_refused: int = 0
    corrupt_timestamps: int = 0
    out_of_range: int = 0


class StateChange(BaseModel):
    at: float
    state: str
    reason: str


class StreamDetail(StreamStatus):
    config: dict[str, Any] = Field(
        description="The definition; password and URL credentials masked."
    )
    history: list[StateChange]


class TunnelStatus(BaseModel):
    """One worker tunnel: its state and health (see ``ingest.tunnel_health``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="'default' (worker_url) or the orchestrator's worker id.")
    url: str
    worker_id: str | None = Field(description="As the worker's HELLO said (once connected).")
    state: str = Field(description="IDLE, CONNECTING, UP, STALLED or DOWN.")
    state_since: float
    stall_reason: str | None = Field(description="Why the worker is not answering.")
    streams: list[str]
    last_result_age_s: float | None = Field(description="While connected.")
    last_heartbeat_age_s: float | None = Field(description="Since the last pong (connected).")
    rtt_p95_ms: float | None
    threshold_s: float = Field(description="No answer this long: STALLED.")
    stalls: int
    connects: int
    errors: int = Field(description="Unexpected errors that ended a session.")
    task_errors: int = Field(description="Streams failed by their sender or result handling.")
    restarts: int
    last_error: str | None


def _status(stream: IngestStream) -> StreamStatus:
    return StreamStatus.model_validate({**stream.describe(), "stalled": stream.stalled})


def _detail(stream: IngestStream) -> StreamDetail:
    return StreamDetail.model_validate({
        **stream.describe(), "stalled": stream.stalled, "config": stream.config.public(),
        "history": list(stream.history),
    })  # fmt: skip


def _http_error(exc: Exception) -> HTTPException:
    if isinstance(exc, UnknownStream):
        return HTTPException(status.HTTP_404_NOT_FOUND, str(exc))
    if isinstance(exc, StreamExists):
        return HTTPException(status.HTTP_409_CONFLICT, str(exc))
    if isinstance(exc, StoreError):
        return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc))
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))


async def _guarded(change: Awaitable[T]) -> T:
    """Await a service change; its errors become HTTP answers."""
    try:
        return await change
    except (ConfigError, SourceError, StoreError) as exc:
        raise _http_error(exc) from None


async def _check_source(service: IngestService, config: StreamConfig) -> None:
    """422 when a definition from the API may not read its source (:mod:`ingest.source_policy`:
    files only under ``file_roots``, no host in ``source_denied_networks``)."""
    settings = service.settings
    problem = await api_source_problem(
        config.url, settings.file_roots, settings.source_denied_networks
    )
    if problem is not None:
        raise _http_error(ConfigError(f"url: {problem}"))


def streams_router(service: IngestService, api: ApiAuth) -> APIRouter:
    router = APIRouter(prefix="/v1/streams", tags=["streams"], route_class=AuthFirstRoute)
    read = [api.requires("streams:read")]
    write = [api.requires("streams:write")]

    @router.get("", dependencies=read, summary="List streams")
    async def list_streams() -> list[StreamStatus]:
        """Every stream with its state and counters."""
        return [_status(s) for s in list(service.streams.values())]

    @router.post("", status_code=status.HTTP_201_CREATED, dependencies=write,
                 summary="Add a stream", responses=errors(409, 503, **CHANGE))  # fmt: skip
    async def add_stream(config: StreamConfig) -> StreamDetail:
        """Validate, store, then start a stream."""
        await _check_source(service, config)
        return _detail(await _guarded(service.create_stream(config)))

    @router.get("/{stream_id}", dependencies=read, summary="Show a stream",
                responses=errors(404, **CHANGE))  # fmt: skip
    async def get_stream(stream_id: str) -> StreamDetail:
        """One stream: state, counters, definition (credentials masked), recent changes."""
        stream = service.streams.get(stream_id)
        if stream is None:
            raise _http_error(UnknownStream(f"no stream {stream_id!r}"))
        return _detail(stream)

    @router.put("/{stream_id}", dependencies=write, summary="Replace a stream's definition",
                responses=errors(404, 503, **CHANGE))  # fmt: skip
    async def replace_stream(stream_id: str, config: StreamConfig) -> StreamDetail:
        """Store the new definition; the stream restarts with it in its next epoch."""
        if config.id != stream_id:
            raise _http_error(ConfigError(f"body id {config.id!r} differs from {stream_id!r}"))
        await _check_source(service, config)
        return _detail(await _guarded(service.update_stream(config)))

    @router.delete("/{stream_id}", status_code=status.HTTP_204_NO_CONTENT, dependencies=write,
                   summary="Remove a stream", responses=errors(404, 503, **CHANGE))  # fmt: skip
    async def remove_stream(stream_id: str) -> Response:
        """Stop the stream, free its state on the ingest and the worker, forget it."""
        await _guarded(service.remove_stream(stream_id))
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    outer = APIRouter(route_class=AuthFirstRoute)
    outer.include_router(router)

    @outer.get("/v1/workers", tags=["workers"], dependencies=read, summary="List worker tunnels")
    async def list_workers() -> list[TunnelStatus]:
        """Every worker tunnel, the default one first: state, health, its streams."""
        tunnels = list(service.registry.clients.items())
        return [TunnelStatus.model_validate({"name": n, **t.describe()}) for n, t in tunnels]

    return outer
