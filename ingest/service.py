"""The ingest service: streams + tunnels + result bus, with a lifecycle.

Streams come from the settings and, when a store is given, from the store
(definitions added over the API; a stored definition wins over a setting with
the same id). ``create_stream``/``update_stream``/``remove_stream`` change
them at runtime and persist the change first: when the store fails nothing
changes. ``place_stream``/``unplace_stream`` are the orchestrator's (they do
not touch the store).

Every stream lives in one :class:`ingest.registry.StreamRegistry`, whatever
tunnel serves it: the default worker (``worker_url``) is one tunnel among the
ones the orchestrator placed streams on, and streams fail over between all of
them. Every tunnel client runs under :func:`ingest.tunnel_client.supervise`:
``run`` never ends because one did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from framerelay import memory
from framerelay.errors import FramerelayError
from ingest.auth import tunnel_tokens
from ingest.bus import ResultBus
from ingest.job_task import JobRuns
from ingest.leases import Route
from ingest.registry import (
    DEFAULT_TUNNEL,
    StreamExists,
    StreamRegistry,
    TunnelOptions,
    UnknownStream,
)
from ingest.serverless_task import ServerlessRuns
from ingest.settings import IngestSettings, StreamConfig
from ingest.shard_glue import ShardedStreams
from ingest.source import SourceSpec
from ingest.store import StreamStore
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient, client_ssl_context

log = logging.getLogger(__name__)
FINISH_POLL_S = 0.1
DRAIN_TIMEOUT_S = 3.0


class IngestService:
    def __init__(self, settings: IngestSettings, store: StreamStore | None = None) -> None:
        memory.tune()  # before the threads: caps glibc's arenas, starts the heap trimmer
        self.settings = settings
        self.store = store
        self.bus = ResultBus()
        self.jobs = JobRuns.of(settings)
        """Streams that run a batch job's task (ingest.job_task): their sidecars."""
        self.bus.tap(self.jobs.result_seen)
        ctx = client_ssl_context(
            str(settings.tls_ca) if settings.tls_ca else None,
            str(settings.tls_client_cert) if settings.tls_client_cert else None,
            str(settings.tls_client_key) if settings.tls_client_key else None,
        )
        self.registry = StreamRegistry(
            tunnel_tokens(settings),
            self.bus.publish,
            TunnelOptions.of(settings),
            ssl_context=ctx,
            default_url=settings.worker_url,
            default_worker_id=settings.worker_id,
            jobs=self.jobs,
            serverless=ServerlessRuns(settings.serverless, self.bus.publish),
        )
        self._pending = list(settings.streams)
        self._changing = asyncio.Lock()
        """Serializes the API's changes (each persists, then changes the registry)."""
        self.sharded = (
            ShardedStreams(settings, self.registry, store, self._changing)
            if settings.shards.enabled
            else None
        )
        """Shard mode (:mod:`ingest.shards`): this replica runs the streams it leases."""
        if self.sharded is not None:
            self.bus.tap(self.sharded.coordinator.result_seen)
        self.started = asyncio.Event()
        """Set once ``run`` has loaded and started the configured and stored streams."""

    @property
    def streams(self) -> Mapping[str, IngestStream]:
        """Every stream (read-only), whichever worker serves it."""
        return self.registry.streams

    @property
    def client(self) -> TunnelClient:
        """The tunnel to the default worker (``worker_url``)."""
        return self.registry.clients[DEFAULT_TUNNEL]

    def add_stream(self, config: StreamConfig, *, first_epoch: int = 0) -> IngestStream:
        """Start a stream now (not persisted; see :meth:`create_stream`)."""
        return self.registry.create(config, first_epoch=first_epoch)

    async def create_stream(self, config: StreamConfig) -> IngestStream:
        """Persist and start a new stream (StreamExists if the id runs, placed or not)."""
        if self.sharded is not None:
            SourceSpec.from_config(config)
            self.jobs.check(config)
            await self.sharded.create(config)
            return self.registry.get(config.id)
        async with self._changing:
            if config.id in self.registry.streams:
                raise StreamExists(f"stream {config.id!r} already exists")
            SourceSpec.from_config(config)  # reject what cannot run before storing it
            self.jobs.check(config)
            if self.registry.serverless is not None:
                self.registry.serverless.check(config)
            if self.store is not None:
                await self.store.put(config)
            return self.registry.create(config)

    async def update_stream(self, config: StreamConfig) -> IngestStream:
        """Persist a new definition and restart the stream with it (next epoch), on the
        worker that serves it."""
        if self.sharded is not None and config.id not in self.registry.streams:
            await self.sharded.not_here(config.id)
        async with self._changing:
            self.registry.get(config.id)
            SourceSpec.from_config(config)
            self.jobs.check(config)
            if self.store is not None:
                await self.store.put(config)
            return await self.registry.update(config)

    async def remove_stream(self, stream_id: str) -> None:
        """Forget a stream (in the store too), stop it and free its state on both sides."""
        if self.sharded is not None:
            return await self.sharded.remove(stream_id)
        async with self._changing:
            self.registry.get(stream_id)
            if self.store is not None:
                await self.store.delete(stream_id)
            await self.registry.remove(stream_id)

    async def place_stream(
        self,
        stream_id: str,
        worker_id: str,
        url: str,
        tls_server_name: str | None = None,
        config: StreamConfig | None = None,
    ) -> bool:
        """The orchestrator places (or moves) a stream; see :meth:`StreamRegistry.place`."""
        if config is not None:
            self.jobs.check(config)
        if self.sharded is not None:
            stored = config.stored() if config is not None else None
            route = Route(worker_id, url, tls_server_name, stored)
            return await self.sharded.place(stream_id, route, config)
        async with self._changing:
            return await self.registry.place(stream_id, worker_id, url, tls_server_name, config)

    async def unplace_stream(self, stream_id: str) -> None:
        """The orchestrator stops a stream it placed (the store keeps a stored one)."""
        if self.sharded is not None:
            return await self.sharded.unplace(stream_id)
        async with self._changing:
            if stream_id not in self.registry.placed():
                raise UnknownStream(f"no placed stream {stream_id!r}")
            await self.registry.remove(stream_id)

    async def run(
        self,
        stop: asyncio.Event,
        *,
        until_finished: bool = False,
        before_streams: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Run until ``stop`` (or, with ``until_finished``, until every source ended).
        ``before_streams`` is awaited once the stored definitions are read and before
        any stream starts (the Redis publisher settles where result ids continue)."""
        shards = None
        try:
            await self._load(before_streams)
            if self.sharded is not None:
                shards = asyncio.create_task(self.sharded.coordinator.run(stop), name="shards")
            while not stop.is_set():
                streams = list(self.streams.values())
                if until_finished and streams and all(s.finished for s in streams):
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINISH_POLL_S):
                        await stop.wait()
        finally:
            stop.set()
            if shards is not None:  # stops our streams and releases their leases first
                await asyncio.gather(shards, return_exceptions=True)
            await self.registry.aclose(DRAIN_TIMEOUT_S)
            if self.registry.serverless is not None:
                await self.registry.serverless.aclose()
            await self.jobs.aclose()
            if self.sharded is not None:
                await self.sharded.aclose()

    async def _load(self, before_streams: Callable[[], Awaitable[object]] | None) -> None:
        """Start the configured and stored streams (a stored definition wins)."""
        configs = {cfg.id: cfg for cfg in self._pending}
        if self.store is not None:
            configs.update((cfg.id, cfg) for cfg in await self.store.load())
        if before_streams is not None:
            await before_streams()
        if self.sharded is not None:  # the coordinator starts the streams this replica leases
            self._pending = []
            self.started.set()
            return
        for cfg in configs.values():
            if cfg.id in self.registry.streams:  # created over the API meanwhile
                continue
            try:
                self.add_stream(cfg)
            except FramerelayError as exc:
                log.error("stream %s not started: %s", cfg.id, exc)
        self._pending = []
        self.started.set()
