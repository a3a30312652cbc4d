"""Route streams to workers chosen by the orchestrator, and move them live.

The ingest holds one tunnel client per worker (:class:`WorkerPool`) and each
stream is on exactly one of them. ``move(stream, worker)`` detaches the stream
from its old worker first - its sender stops, a CLOSE frees the old session,
frames in flight there are counted ``disconnected`` - and then adds it to the
new worker with the latest session snapshot the old worker sent, so the new
worker resumes the tracker and track ids continue. A stream is therefore
never served by two workers at once, and its decode thread never stops.

**Failover.** When a worker's tunnel is unhealthy - ``STALLED`` (the worker
stopped answering heartbeats or frames, see :mod:`ingest.tunnel_health`), or
not back within the stall threshold after its connection dropped - and
another worker's tunnel is ``UP``, the pool moves every stream of the
unhealthy worker there at once (fewest streams first), with its latest
snapshot, so track ids continue; the unhealthy tunnel is then closed (frames
in flight there count ``disconnected``). Each such move counts in ``moves``
and ``failovers`` and is logged; ``GET /v1/routing`` shows the new placement.
With no other worker up the streams stay ``STALLED`` and recover by
themselves when the worker answers again. The orchestrator may place a
stream again later: a ``PUT`` naming the worker it is on now changes
nothing, one naming another worker (the old one too) moves it there.

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
from ingest.tunnel_client import TunnelClient, supervise
from ingest.tunnel_health import TunnelState

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
        heartbeat_interval_s: float = 0.5,
        stall_after_s: float = 3.0,
    ) -> None:
        self._token_for = token_for
        self._on_result = on_result
        self.max_inflight = max_inflight
        self._ssl = ssl_context
        self.allow_insecure = allow_insecure
        self._timeouts = (frame_timeout_s, reconnect_max_s)
        self._heartbeat = (heartbeat_interval_s, stall_after_s)
        self.clients: dict[str, TunnelClient] = {}
        self.streams: dict[str, IngestStream] = {}
        self.where: dict[str, str] = {}
        self.moves = 0
        self.failovers = 0
        """Streams moved off an unhealthy worker by the pool itself."""
        self._adopted: dict[str, Snapshot | None] = {}
        self._runs: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._lock = asyncio.Lock()
        self._failover_due = False
        self._failing: asyncio.Task[None] | None = None
        self._stuck: set[str] = set()
        """Unhealthy workers whose streams had nowhere to go (logged once)."""

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
            heartbeat_interval_s=self._heartbeat[0],
            stall_after_s=self._heartbeat[1],
            on_state=lambda c, w=worker_id: self._tunnel_changed(w, c),  # type: ignore[misc]
        )
        self.clients[worker_id] = client
        stop = asyncio.Event()
        self._runs[worker_id] = (
            stop,
            asyncio.create_task(supervise(client, stop), name=f"tunnel-{worker_id}"),
        )
        return client

    def _tunnel_changed(self, worker_id: str, client: TunnelClient) -> None:
        """A tunnel's state changed: fail streams over if one is unhealthy and one is up."""
        if self.clients.get(worker_id) is not client:
            return
        if not client.unhealthy:
            self._stuck.discard(worker_id)
        if any(c.unhealthy for c in self.clients.values()):
            self._failover_due = True
            if self._failing is None or self._failing.done():
                self._failing = asyncio.create_task(self._fail_over(), name="tunnel-failover")

    async def _fail_over(self) -> None:
        while self._failover_due:
            self._failover_due = False
            try:
                async with self._lock:
                    for worker_id, client in list(self.clients.items()):
                        if client.unhealthy and self.clients.get(worker_id) is client:
                            await self._evacuate(worker_id, client)
                    await self._close_idle()
            except Exception:  # a bug here must not end failover for good
                log.exception("failover failed; trying again at the next tunnel change")

    async def _evacuate(self, worker_id: str, client: TunnelClient) -> None:
        """Move every stream of the unhealthy ``worker_id`` to workers that are up."""
        moved: list[str] = []
        for stream_id in sorted(s for s, w in self.where.items() if w == worker_id):
            target = self._healthy_target(exclude=worker_id)
            if target is None:
                break
            detached = await client.detach(stream_id, close=False)  # no CLOSE into a stall
            if detached is None:
                continue
            stream, snapshot = detached
            target_id, target_client = target
            target_client.add(stream, snapshot=snapshot)
            self.where[stream_id] = target_id
            self.moves += 1
            self.failovers += 1
            moved.append(f"{stream_id} -> {target_id}")
        if moved:
            log.warning("worker %s unhealthy (%s): failed over %s",
                        worker_id, client.stall_reason, ", ".join(moved))  # fmt: skip
        elif client.streams and worker_id not in self._stuck:
            self._stuck.add(worker_id)
            log.warning("worker %s unhealthy (%s) and no other worker is up: its streams wait",
                        worker_id, client.stall_reason)  # fmt: skip

    def _healthy_target(self, exclude: str) -> tuple[str, TunnelClient] | None:
        up = [(len(c.streams), w, c) for w, c in self.clients.items()
              if w != exclude and c.state is TunnelState.UP]  # fmt: skip
        if not up:
            return None
        _, worker_id, client = min(up, key=lambda t: (t[0], t[1]))
        return worker_id, client

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
            here = self.clients.get(old) if old is not None else None
            if (
                old == worker_id
                and here is not None
                and (here.url, here.server_hostname)
                == (
                    url,
                    tls_server_name,
                )
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
        if self._failing is not None:
            self._failing.cancel()
            await asyncio.gather(self._failing, return_exceptions=True)
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
