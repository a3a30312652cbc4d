"""The ingest service's side of sharding: what a replica runs, and the API in shard mode.

:class:`ShardedStreams` gives :class:`ingest.shards.ShardCoordinator` its hooks on
the service's registry, and carries the API's changes across replicas:

* ``POST /v1/streams`` stores the definition in the shared store and runs the
  stream here (StreamExists if another replica holds it);
* ``PUT /v1/streams/{id}`` is for the replica that runs the stream (another
  answers 404 naming it); a changed definition in the shared store is picked
  up by its runner at the next renewal too;
* ``DELETE /v1/streams/{id}`` works on any replica: the definition leaves the
  shared store, and the runner stops the stream (at once when it is this one,
  else at its next renewal);
* the orchestrator's ``PUT /v1/streams/{id}/worker`` is stored in the shared
  routes: the stream's owner applies it (at once when it is this one), and a
  new stream starts here; ``DELETE`` drops the route and the stream.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError
from redis.asyncio import Redis

from framerelay.errors import ConfigError, FramerelayError
from framerelay.protocol import SessionSnapshot
from ingest.leases import TIMEOUT_S, LeaseBoard, Route
from ingest.registry import StreamExists, StreamRegistry, UnknownStream
from ingest.resume import ResumeAt
from ingest.settings import IngestSettings, StreamConfig
from ingest.shards import ShardCoordinator, ShardHooks
from ingest.store import StoreError, StreamStore

log = logging.getLogger(__name__)


class ShardedStreams:
    def __init__(
        self,
        settings: IngestSettings,
        registry: StreamRegistry,
        store: StreamStore | None,
        lock: asyncio.Lock,
    ) -> None:
        if settings.redis_url is None:  # the settings refuse this already
            raise ConfigError("FRAMERELAY_INGEST_SHARDS__ENABLED needs FRAMERELAY_REDIS_URL")
        shards = settings.shards
        url = settings.redis_url.get_secret_value()
        self.redis = Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        self.board = LeaseBoard(self.redis, shards.prefix, shards.replica_id, shards.lease_ttl_s)
        self.registry = registry
        self.store = store
        self._configured = {c.id: c for c in settings.streams}
        self._lock = lock
        self._known: dict[str, StreamConfig] = dict(self._configured)
        hooks = ShardHooks(
            wanted=self.wanted, start=self._start, stop=self._stop, snapshot=registry.snapshot,
            route=self._route, running=lambda sid: sid in registry.streams, update=self._update,
        )  # fmt: skip
        self.coordinator = ShardCoordinator(self.board, shards, hooks)

    async def aclose(self) -> None:
        await self.redis.aclose()

    # -- the coordinator's hooks -------------------------------------------------------

    async def wanted(self) -> dict[str, StreamConfig]:
        """Every stream some replica should run (the last known set if the store fails)."""
        try:
            stored = await self.store.load() if self.store is not None else []
        except StoreError as exc:
            log.warning("shards: %s; keeping the streams known", exc)
            return self._known
        out = dict(self._configured)
        out.update((c.id, c) for c in stored)
        for sid, route in self.coordinator.routes.items():
            if sid not in out and route.stream is not None:
                try:
                    out[sid] = StreamConfig.model_validate(route.stream)
                except ValidationError:
                    continue
        self._known = out
        return out

    async def _start(self, config: StreamConfig, snap: SessionSnapshot | None,
                     resume: ResumeAt | None, route: Route | None) -> None:  # fmt: skip
        epoch = snap[0].epoch + 1 if snap is not None and snap[0].epoch is not None else 0
        async with self._lock:
            if config.id in self.registry.streams:
                await self.registry.remove(config.id)
            self.registry.create(config, first_epoch=epoch, snapshot=snap, resume=resume,
                                 served=route is None)  # fmt: skip
            if route is not None:
                await self.registry.place(config.id, route.worker_id, route.url,
                                          route.tls_server_name)  # fmt: skip

    async def _stop(self, stream_id: str) -> None:
        async with self._lock:
            if stream_id in self.registry.streams:
                await self.registry.remove(stream_id)

    async def _route(self, stream_id: str, route: Route) -> None:
        async with self._lock:
            try:
                await self.registry.place(stream_id, route.worker_id, route.url,
                                          route.tls_server_name)  # fmt: skip
            except FramerelayError as exc:
                log.warning("shards: route of stream %s not applied: %s", stream_id, exc)

    async def _update(self, config: StreamConfig) -> None:
        stream = self.registry.streams.get(config.id)
        if stream is not None and stream.config != config:
            async with self._lock:
                await self.registry.update(config)

    # -- the API in shard mode (each takes the service's lock where it changes streams) ---

    async def create(self, config: StreamConfig) -> None:
        if config.id in self.registry.streams or await self.board.owners([config.id]):
            raise StreamExists(f"stream {config.id!r} already exists")
        if self.store is not None:
            await self.store.put(config)
        self._known[config.id] = config
        if not await self.coordinator.claim(config):
            raise StreamExists(f"stream {config.id!r} is run by another ingest replica")

    async def not_here(self, stream_id: str) -> None:
        """UnknownStream naming the replica that runs ``stream_id``, if another does."""
        owner = (await self.board.owners([stream_id])).get(stream_id)
        if owner is not None and owner[0] != self.board.replica:
            raise UnknownStream(
                f"stream {stream_id!r} runs on ingest replica {owner[0]!r}: send the change there"
            )

    async def remove(self, stream_id: str) -> None:
        """Forget the stream everywhere; stop it here if it runs here."""
        if stream_id not in self.registry.streams and stream_id not in await self.wanted():
            raise UnknownStream(f"no stream {stream_id!r}")
        if self.store is not None:
            await self.store.delete(stream_id)
        await self.board.drop_route(stream_id)
        self._known.pop(stream_id, None)
        await self._release_here(stream_id)

    async def place(self, stream_id: str, route: Route, config: StreamConfig | None) -> bool:
        if config is None and stream_id not in self.registry.streams:
            if stream_id not in await self.wanted():
                raise UnknownStream(f"unknown stream {stream_id!r}: send its definition")
        await self.board.put_route(stream_id, route)
        async with self._lock:
            if stream_id in self.registry.streams:
                return await self.registry.place(stream_id, route.worker_id, route.url,
                                                 route.tls_server_name, config)  # fmt: skip
        if config is not None and not await self.board.owners([stream_id]):
            return await self.coordinator.claim(config, route)
        return True  # its owner applies the route at its next renewal

    async def unplace(self, stream_id: str) -> None:
        routes = await self.board.routes()
        if stream_id not in routes and stream_id not in self.registry.placed():
            raise UnknownStream(f"no placed stream {stream_id!r}")
        await self.board.drop_route(stream_id)
        await self._release_here(stream_id)

    async def _release_here(self, stream_id: str) -> None:
        epoch = self.coordinator.forget(stream_id)
        await self._stop(stream_id)
        if epoch is not None:
            await self.board.log(stream_id, epoch, "stop")
            if await self.board.release(stream_id, epoch):
                await self.board.log(stream_id, epoch, "release")
