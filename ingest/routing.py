"""Route streams to workers chosen by the orchestrator, and move them live.

The ingest holds one tunnel client per worker (:class:`WorkerPool`) and each
stream is on exactly one of them. ``move(stream, worker)`` detaches the stream
from its old worker first - its sender stops, a CLOSE frees the old session,
frames in flight there are counted ``disconnected`` - and then adds it to the
new worker with the latest session snapshot the old worker sent, so the new
worker resumes the tracker and track ids continue. A stream is therefore
never served by two workers at once, and its decode thread never stops.

``routing_router`` exposes it to the orchestrator:

* ``PUT /v1/streams/{id}/worker`` ``{"worker_id", "url", "stream"?,
  "tls_server_name"?}`` - place or move a stream (``stream``: its definition,
  to create it if new; ``tls_server_name``: the name the worker's certificate
  must carry, e.g. ``<pod>.pods.framerelay``, checked against the ingest's
  ``tls_ca``); idempotent. Scope ``routing:write``. A ``ws://`` URL to a host
  that is not this one is refused (422) unless ``allow_insecure_workers``.
* ``DELETE /v1/streams/{id}/worker`` - stop the stream and forget it
  (``routing:write``).
* ``GET /v1/routing`` - stream -> worker (``streams:read``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from framerelay import wire
from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.errors import ConfigError
from framerelay.results import ResultRecord
from ingest.auth import HOSTNAME, check_worker_url
from ingest.settings import StreamConfig
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient

log = logging.getLogger(__name__)
Snapshot = tuple[wire.SessionClock, bytes]
STOP_TIMEOUT_S = 5.0


class WorkerPool:
    """One tunnel client per worker; every stream on exactly one of them."""

    def __init__(
        self,
        token_for: Callable[[str], str],
        on_result: Callable[[ResultRecord], None],
        *,
        max_inflight: int = 4,
        ssl_context: ssl.SSLContext | None = None,
        frame_timeout_s: float = 10.0,
        reconnect_max_s: float = 10.0,
        allow_insecure: bool = False,
    ) -> None:
        self._token_for = token_for
        self._on_result = on_result
        self.max_inflight = max_inflight
        self._ssl = ssl_context
        self.allow_insecure = allow_insecure
        self._timeouts = (frame_timeout_s, reconnect_max_s)
        self.clients: dict[str, TunnelClient] = {}
        self.streams: dict[str, IngestStream] = {}
        self.where: dict[str, str] = {}
        self.moves = 0
        self._adopted: dict[str, Snapshot | None] = {}
        self._runs: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._lock = asyncio.Lock()

    def _client(self, worker_id: str, url: str, server_name: str | None) -> TunnelClient:
        client = self.clients.get(worker_id)
        if client is not None and (client.url, client.server_hostname) == (url, server_name):
            return client
        secure = url.startswith("wss://")
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        client = TunnelClient(
            url,
            lambda: self._token_for(worker_id),
            self._on_result,
            ssl_context=self._ssl if secure else None,
            server_hostname=server_name,
            frame_timeout_s=self._timeouts[0],
            reconnect_max_s=self._timeouts[1],
        )
        self.clients[worker_id] = client
        stop = asyncio.Event()
        self._runs[worker_id] = (
            stop,
            asyncio.create_task(client.run(stop), name=f"tunnel-{worker_id}"),
        )
        return client

    def add_stream(self, config: StreamConfig) -> IngestStream:
        stream = self.streams.get(config.id)
        if stream is None:
            stream = IngestStream(
                config,
                asyncio.get_running_loop(),
                self.max_inflight,
                link_up=lambda sid=config.id: self._link_up(sid),  # type: ignore[misc]
            )
            self.streams[config.id] = stream
            stream.launch()
        return stream

    def adopt(self, stream: IngestStream, snapshot: Snapshot | None) -> None:
        """Take over a running stream (detached from another client) and its snapshot."""
        self.streams[stream.id] = stream
        self._adopted[stream.id] = snapshot

    def _link_up(self, stream_id: str) -> bool:
        client = self.clients.get(self.where.get(stream_id, ""))
        return client is not None and client.connected.is_set()

    async def move(
        self, stream_id: str, worker_id: str, url: str, tls_server_name: str | None = None
    ) -> bool:
        """Send ``stream_id`` to ``worker_id`` (at ``url``, its certificate checked for
        ``tls_server_name`` when given); False if already there. ConfigError for a
        URL this pool must not use (see :func:`ingest.auth.check_worker_url`)."""
        check_worker_url(url, allow_insecure=self.allow_insecure, tls_server_name=tls_server_name)
        async with self._lock:
            stream = self.streams.get(stream_id)
            if stream is None:
                raise KeyError(stream_id)
            old = self.where.get(stream_id)
            if old == worker_id and (self.clients[old].url, self.clients[old].server_hostname) == (
                url,
                tls_server_name,
            ):
                return False
            snapshot: Snapshot | None = self._adopted.pop(stream_id, None)
            if old is not None and old in self.clients:
                detached = await self.clients[old].detach(stream_id)
                snapshot = detached[1] if detached else None
            self._client(worker_id, url, tls_server_name).add(stream, snapshot=snapshot)
            self.where[stream_id] = worker_id
            self.moves += old is not None
            log.info(
                "stream %s: %s -> %s (snapshot: %s)",
                stream_id,
                old,
                worker_id,
                snapshot is not None,
            )
            await self._close_idle()
            return True

    async def remove(self, stream_id: str) -> bool:
        async with self._lock:
            stream = self.streams.pop(stream_id, None)
            worker = self.where.pop(stream_id, None)
            if worker is not None and worker in self.clients:
                await self.clients[worker].detach(stream_id)
            if stream is not None:
                stream.stop()
                await asyncio.to_thread(stream.join, STOP_TIMEOUT_S)
            await self._close_idle()
            return stream is not None

    async def _close_idle(self) -> None:
        """Stop tunnels that carry no stream (e.g. to a dead worker)."""
        for worker_id in [w for w, c in self.clients.items() if not c.streams]:
            self.clients.pop(worker_id)
            stop, task = self._runs.pop(worker_id)
            stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)

    async def aclose(self) -> None:
        for stream in self.streams.values():
            stream.stop()
        for stop, _ in self._runs.values():
            stop.set()
        tasks = [t for _, t in self._runs.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        for stream in self.streams.values():
            await asyncio.to_thread(stream.join, STOP_TIMEOUT_S)
        self._runs.clear()
        self.clients.clear()


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    worker_id: str = Field(min_length=1, max_length=128)
    url: str = Field(pattern=r"^wss?://", max_length=2048)
    stream: StreamConfig | None = None
    tls_server_name: str | None = Field(
        None,
        pattern=HOSTNAME,
        max_length=253,
        description="The DNS name the worker's certificate must carry (wss:// only), "
        "e.g. <pod>.pods.framerelay; default: the URL's host.",
    )


Adopt = Callable[[str], Awaitable[tuple[IngestStream, Snapshot | None] | None]]


def routing_router(pool: WorkerPool, api: ApiAuth, adopt: Adopt | None = None) -> APIRouter:
    """The orchestrator's endpoints. ``adopt(stream_id)`` hands over a stream the
    ingest runs on its default worker, so the orchestrator can place it too."""
    router = APIRouter(route_class=AuthFirstRoute)
    write = [api.requires("routing:write")]

    @router.put("/v1/streams/{stream_id}/worker", dependencies=write)
    async def assign(stream_id: str, body: Assignment) -> dict[str, Any]:
        try:  # refuse before anything changes
            check_worker_url(body.url, allow_insecure=pool.allow_insecure,
                             tls_server_name=body.tls_server_name)  # fmt: skip
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from None
        if stream_id not in pool.streams and adopt is not None:
            taken = await adopt(stream_id)
            if taken is not None:
                pool.adopt(*taken)
        if stream_id not in pool.streams:
            if body.stream is None or body.stream.id != stream_id:
                raise HTTPException(404, f"unknown stream {stream_id!r}: send its definition")
            pool.add_stream(body.stream)
        moved = await pool.move(stream_id, body.worker_id, body.url, body.tls_server_name)
        return {"stream": stream_id, "worker_id": body.worker_id, "changed": moved}

    @router.delete("/v1/streams/{stream_id}/worker", dependencies=write)
    async def unassign(stream_id: str) -> dict[str, Any]:
        if not await pool.remove(stream_id):
            raise HTTPException(404, f"unknown stream {stream_id!r}")
        return {"stream": stream_id, "removed": True}

    @router.get("/v1/routing", dependencies=[api.requires("streams:read")])
    async def routing() -> dict[str, str]:
        return dict(pool.where)

    return router
