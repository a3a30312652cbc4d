"""The ingest service: streams + tunnel client + result bus, with a lifecycle.

Streams come from the settings and, when a store is given, from the store
(definitions added over the API; a stored definition wins over a setting with
the same id). ``create_stream``/``update_stream``/``remove_stream`` change
them at runtime and persist the change first: when the store fails nothing
changes. Removing a stream stops its decode thread, lets the last frames in
flight come back (bounded), sends CLOSE so the worker frees its session, and
forgets every per-stream state of the ingest.

Streams run on the default worker (``worker_url``) unless the orchestrator
places them: ``pool`` (:mod:`ingest.routing`) holds one tunnel per worker it
named and moves streams between them live, with their session snapshots
(and fails them over when a worker stalls). Every tunnel client runs under
:func:`ingest.tunnel_client.supervise`: ``run`` never ends because one did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from framerelay.errors import ConfigError, FramerelayError
from ingest.auth import check_worker_url, tunnel_tokens
from ingest.bus import ResultBus
from ingest.routing import Snapshot, WorkerPool
from ingest.settings import IngestSettings, StreamConfig
from ingest.source import SourceSpec
from ingest.store import StreamStore
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient, client_ssl_context, supervise

log = logging.getLogger(__name__)
DEFAULT_TUNNEL = "default"
"""The name of the tunnel to ``worker_url`` among :attr:`IngestService.tunnels`."""
FINISH_POLL_S = 0.1
DRAIN_TIMEOUT_S = 3.0
RETIRE_GRACE_S = 2.0
JOIN_TIMEOUT_S = 5.0


class StreamExists(ConfigError):
    """A stream with this id is already running."""


class UnknownStream(ConfigError):
    """No stream has this id."""


class IngestService:
    def __init__(self, settings: IngestSettings, store: StreamStore | None = None) -> None:
        self.settings = settings
        self.store = store
        self.bus = ResultBus()
        check_worker_url(settings.worker_url, allow_insecure=settings.allow_insecure_workers)
        self._token_for = tunnel_tokens(settings)
        """``token_for(worker_id)``: a fixed token (it must grant every worker used), or
        one minted per connect."""
        ctx = client_ssl_context(
            str(settings.tls_ca) if settings.tls_ca else None,
            str(settings.tls_client_cert) if settings.tls_client_cert else None,
            str(settings.tls_client_key) if settings.tls_client_key else None,
        )
        self.client = TunnelClient(
            settings.worker_url,
            self._token,
            self.bus.publish,
            ssl_context=ctx if settings.worker_url.startswith("wss://") else None,
            frame_timeout_s=settings.frame_timeout_s,
            reconnect_max_s=settings.reconnect_max_s,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            stall_after_s=settings.stall_after_s,
        )
        self.pool = WorkerPool(
            self._token_for,
            self.bus.publish,
            max_inflight=settings.max_inflight,
            ssl_context=ctx,
            frame_timeout_s=settings.frame_timeout_s,
            reconnect_max_s=settings.reconnect_max_s,
            allow_insecure=settings.allow_insecure_workers,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            stall_after_s=settings.stall_after_s,
        )
        self._pending = list(settings.streams)
        self._changing = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self.started = asyncio.Event()
        """Set once ``run`` has loaded and started the configured and stored streams."""

    def _token(self) -> str:
        return self._token_for(self.settings.worker_id)

    @property
    def streams(self) -> dict[str, IngestStream]:
        """Every stream: on the default worker, or placed by the orchestrator."""
        return {**self.client.streams, **self.pool.streams}

    @property
    def tunnels(self) -> dict[str, TunnelClient]:
        """Every tunnel: ``default`` (to ``worker_url``) and the pool's, by worker id."""
        return {DEFAULT_TUNNEL: self.client, **self.pool.clients}

    async def adopt_stream(self, stream_id: str) -> tuple[IngestStream, Snapshot | None] | None:
        """Hand a default-worker stream over to the pool (the orchestrator places it)."""
        async with self._changing:
            return await self.client.detach(stream_id)

    def add_stream(self, config: StreamConfig, *, first_epoch: int = 0) -> IngestStream:
        """Start a stream now (not persisted; see :meth:`create_stream`)."""
        if config.id in self.client.streams:
            raise StreamExists(f"stream {config.id!r} already exists")
        loop = asyncio.get_running_loop()
        stream = IngestStream(
            config,
            loop,
            self.settings.max_inflight,
            link_up=self.client.connected.is_set,
            first_epoch=first_epoch,
        )
        self.client.add(stream)
        stream.launch()
        return stream

    def _get(self, stream_id: str) -> IngestStream:
        stream = self.client.streams.get(stream_id)
        if stream is None:
            raise UnknownStream(f"no stream {stream_id!r}")
        return stream

    async def create_stream(self, config: StreamConfig) -> IngestStream:
        """Persist and start a new stream."""
        async with self._changing:
            if config.id in self.client.streams:
                raise StreamExists(f"stream {config.id!r} already exists")
            SourceSpec.from_config(config)  # reject what cannot run before storing it
            if self.store is not None:
                await self.store.put(config)
            return self.add_stream(config)

    async def update_stream(self, config: StreamConfig) -> IngestStream:
        """Persist a new definition and restart the stream with it (next epoch)."""
        async with self._changing:
            old = self._get(config.id)
            SourceSpec.from_config(config)
            if self.store is not None:
                await self.store.put(config)
            await self._retire(old)
            return self.add_stream(config, first_epoch=old.epoch + 1)

    async def remove_stream(self, stream_id: str) -> None:
        """Forget a stream (in the store too), stop it and free its state on both sides."""
        async with self._changing:
            if stream_id in self.pool.streams:  # placed by the orchestrator
                if self.store is not None:
                    await self.store.delete(stream_id)
                await self.pool.remove(stream_id)
                return
            stream = self._get(stream_id)
            if self.store is not None:
                await self.store.delete(stream_id)
            await self._retire(stream)

    async def _retire(self, stream: IngestStream) -> None:
        stream.stop()
        await asyncio.sleep(0)  # a sender spawned just now starts (and sees the closed slot)
        try:  # the sender waits for the last results, then sends CLOSE to the worker
            async with asyncio.timeout(self.settings.frame_timeout_s + RETIRE_GRACE_S):
                await stream.sender_idle.wait()
        except TimeoutError:
            log.warning("stream %s: sender still busy after removal; dropping it", stream.id)
        self.client.streams.pop(stream.id, None)
        self.client.snapshots.pop(stream.id, None)
        if stream.alive:  # blocked in a read at most read_timeout_s; do not hold the API
            task = asyncio.create_task(asyncio.to_thread(stream.join, JOIN_TIMEOUT_S * 4))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def run(self, stop: asyncio.Event, *, until_finished: bool = False) -> None:
        """Run until ``stop`` (or, with ``until_finished``, until every source ended)."""
        configs = {cfg.id: cfg for cfg in self._pending}
        if self.store is not None:
            configs.update((cfg.id, cfg) for cfg in await self.store.load())
        for cfg in configs.values():
            try:
                self.add_stream(cfg)
            except FramerelayError as exc:
                log.error("stream %s not started: %s", cfg.id, exc)
        self._pending = []
        self.started.set()
        client_stop = asyncio.Event()
        client = asyncio.create_task(supervise(self.client, client_stop), name="tunnel-client")
        try:
            while not stop.is_set():
                if (
                    until_finished
                    and self.streams
                    and all(s.finished for s in self.streams.values())
                ):
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINISH_POLL_S):
                        await stop.wait()
        finally:
            stop.set()
            for stream in self.streams.values():
                stream.stop()
            await self.client.drain(DRAIN_TIMEOUT_S)
            client_stop.set()
            await client
            for stream in self.streams.values():
                await asyncio.to_thread(stream.join, JOIN_TIMEOUT_S)
            if self._retiring:
                await asyncio.wait(set(self._retiring), timeout=JOIN_TIMEOUT_S)
            await self.pool.aclose()
