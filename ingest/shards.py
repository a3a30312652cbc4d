"""Several ingest replicas share the streams through Redis: leases, takeover, fair share.

Opt-in (``FRAMERELAY_INGEST_SHARDS__ENABLED``, needs ``FRAMERELAY_REDIS_URL``); a
single ingest without it runs every stream itself, as before.

**Which streams.** The wanted streams are the same for every replica: the
configured ones, the shared stream store (``store_key``, one Redis hash for
all replicas) and the orchestrator's placements (``<prefix>:routes``, written
by whichever replica the orchestrator reached).

**Leases** (:mod:`ingest.leases`). Every ``renew_interval_s`` a replica renews
its own lease and those of its streams. A stream is run by the replica that
holds its lease, taken only when free; each take bumps the stream's epoch (the
fencing token). A replica that cannot renew a lease (it expired, another took
it, Redis did not answer within 3/4 of ``lease_ttl_s`` since the last good
renewal) stops that stream at once, before the lease can expire in Redis, so a
stream is never decoded by two replicas. ``kill -9`` leaves the leases to
expire: within ``lease_ttl_s`` + ``renew_interval_s`` the survivors take them.

**Snapshots.** The worker's tracker snapshots of a stream are copied to Redis
(fenced by the lease's epoch) as they come. The replica that takes a stream
over resumes the session from it (track ids continue), in the next epoch, and
starts a file where the stream was: for a file paced like a live camera, as far
on as the time since that snapshot (the camera did not wait); for a file read
as fast as possible, at the last frame answered.

**Fair share.** A replica takes free streams up to ``ceil(streams / live
replicas)``; one holding more hands one over per ``rebalance_interval_s``
(stops it, keeps its snapshot, releases the lease). A new replica thus gets its
share over time; live leases are never stolen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from framerelay.errors import FramerelayError
from framerelay.protocol import SessionSnapshot
from ingest.leases import LeaseBoard, Route
from ingest.settings import StreamConfig
from ingest.shard_settings import ShardSettings

log = logging.getLogger(__name__)
SNAPSHOT_SYNC_S = 0.2
SAFE_FRACTION = 0.75
"""A lease counts as ours for this fraction of its TTL after the last good renewal."""
REDIS_ERRORS = (RedisError, OSError, TimeoutError)


@dataclass
class Held:
    epoch: int
    valid_until: float
    """Monotonic time past which we must not run the stream without a renewal."""
    synced: object = None
    """The last snapshot copied to Redis (by identity)."""


@dataclass
class ShardHooks:
    """What the coordinator asks of the ingest service."""

    wanted: Callable[[], Awaitable[dict[str, StreamConfig]]]
    start: Callable[
        [StreamConfig, SessionSnapshot | None, float | None, Route | None], Awaitable[None]
    ]
    stop: Callable[[str], Awaitable[None]]
    snapshot: Callable[[str], SessionSnapshot | None]
    route: Callable[[str, Route], Awaitable[None]]
    running: Callable[[str], bool]
    update: Callable[[StreamConfig], Awaitable[None]]
    realtime: Callable[[StreamConfig], bool] = field(default=lambda c: c.realtime)


class ShardCoordinator:
    """Runs this replica's share of the streams (see the module doc)."""

    def __init__(self, board: LeaseBoard, settings: ShardSettings, hooks: ShardHooks) -> None:
        self.board = board
        self.settings = settings
        self.hooks = hooks
        self.held: dict[str, Held] = {}
        self.live: list[str] = []
        self.takeovers = 0
        self.lost = 0
        self._shed_at = 0.0
        self._routes: dict[str, Route] = {}
        self._failing: str | None = None

    @property
    def replica(self) -> str:
        return self.board.replica

    async def run(self, stop: asyncio.Event) -> None:
        """Coordinate until ``stop``; then stop our streams and release their leases."""
        sync = asyncio.create_task(self._sync_snapshots(stop), name="shard-snapshots")
        try:
            await self._guarded(self.board.heartbeat)
            await _wait(stop, self.settings.renew_interval_s)  # let peers that start with us show
            while not stop.is_set():
                await self._guarded(self.tick)
                await _wait(stop, self.settings.renew_interval_s)
        finally:
            stop.set()
            await asyncio.gather(sync, return_exceptions=True)
            await self.release_all()

    async def _guarded(self, step: Callable[[], Awaitable[object]]) -> None:
        try:
            await step()
            self._failing = None
        except REDIS_ERRORS as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if reason != self._failing:
                log.warning("shards: Redis failed (%s); leases end unless renewed", reason)
            self._failing = reason
        finally:
            await self._expire_unrenewed()

    async def tick(self) -> None:
        self.live = await self.board.heartbeat()
        await self._renew()
        wanted = await self.hooks.wanted()
        for sid in [s for s in self.held if s not in wanted]:
            await self.give_up(sid, "release")
        self._routes = await self.board.routes()
        await self._apply_routes()
        for sid in [s for s in self.held if s in wanted]:
            await self.hooks.update(wanted[sid])  # a definition changed through another replica
        await self._take_free(wanted)
        await self._shed(len(wanted))

    async def _renew(self) -> None:
        for sid, held in list(self.held.items()):
            sent = time.monotonic()
            if await self.board.renew(sid, held.epoch):
                held.valid_until = sent + self.settings.lease_ttl_s * SAFE_FRACTION
            else:
                log.warning("shards: lost the lease of stream %s (epoch %d): stopping it",
                            sid, held.epoch)  # fmt: skip
                self.lost += 1
                await self._drop(sid, "lost", release=False)

    async def _expire_unrenewed(self) -> None:
        now = time.monotonic()
        for sid, held in list(self.held.items()):
            if now >= held.valid_until:
                log.warning("shards: lease of stream %s not renewed in time: stopping it", sid)
                self.lost += 1
                await self._drop(sid, "lost", release=False)

    def fair_share(self, streams: int) -> int:
        return math.ceil(streams / max(1, len(self.live)))

    async def _take_free(self, wanted: dict[str, StreamConfig]) -> None:
        share = self.fair_share(len(wanted))
        free = [s for s in wanted if s not in self.held]
        owners = await self.board.owners(free)
        for sid in sorted(free, key=self._order):
            if len(self.held) >= share:
                return
            if sid not in owners:
                await self.claim(wanted[sid])

    def _order(self, stream_id: str) -> int:
        """Each replica tries free streams in its own order: fewer collisions."""
        return zlib.crc32(f"{self.replica}/{stream_id}".encode())

    async def claim(self, config: StreamConfig, route: Route | None = None) -> bool:
        """Take the stream's lease if free and start it here (resuming its snapshot), on
        ``route`` (default: the stream's shared route, if any)."""
        sent = time.monotonic()
        epoch = await self.board.acquire(config.id)
        if epoch == 0:
            return False
        self.held[config.id] = Held(epoch, sent + self.settings.lease_ttl_s * SAFE_FRACTION)
        snap = await self.board.snapshot(config.id)
        start_at = self._start_at(config, snap)
        route = route or self._routes.get(config.id)
        try:
            await self.hooks.start(config, snap, start_at, route)
        except (FramerelayError, ValueError) as exc:
            log.error("shards: stream %s not started: %s", config.id, exc)
            await self._drop(config.id, "release", release=True)
            return False
        self.takeovers += snap is not None
        await self.board.log(config.id, epoch, "start")
        log.info("shards: %s runs stream %s (epoch %d, snapshot: %s, from %s s)", self.replica,
                 config.id, epoch, snap is not None, start_at)  # fmt: skip
        return True

    def _start_at(self, config: StreamConfig, snap: SessionSnapshot | None) -> float | None:
        """Where a file resumes: the snapshot's last frame, plus the time since for a file
        paced like a live camera. None: from the start."""
        if snap is None or snap[0].epoch is None or snap[0].last_t < -1e17:
            return None
        clock = snap[0]
        at = clock.last_t - clock.offset
        if self.hooks.realtime(config) and clock.last_captured > 0:
            at += min(max(0.0, time.time() - clock.last_captured), 3600.0)
        return max(0.0, at)

    async def _apply_routes(self) -> None:
        for sid, route in self._routes.items():
            if sid in self.held and self.hooks.running(sid):
                await self.hooks.route(sid, route)

    async def _shed(self, streams: int) -> None:
        now = time.monotonic()
        excess = len(self.held) - self.fair_share(streams)
        if excess <= 0 or now - self._shed_at < self.settings.rebalance_interval_s:
            return
        self._shed_at = now
        sid = max(self.held, key=self._order)
        log.info("shards: %s holds %d streams, fair share %d: handing %s over",
                 self.replica, len(self.held), len(self.held) - excess, sid)  # fmt: skip
        await self.give_up(sid, "release")

    async def give_up(self, stream_id: str, event: str) -> None:
        """Stop the stream here, keep its latest snapshot, release its lease."""
        await self._drop(stream_id, event, release=True)

    async def _drop(self, stream_id: str, event: str, *, release: bool) -> None:
        held = self.held.pop(stream_id, None)
        if held is None:
            return
        snap = self.hooks.snapshot(stream_id)
        await self.hooks.stop(stream_id)
        with contextlib.suppress(*REDIS_ERRORS):
            if release and snap is not None and snap is not held.synced:
                await self.board.put_snapshot(stream_id, held.epoch, snap,
                                              self.settings.snapshot_ttl_s)  # fmt: skip
            await self.board.log(stream_id, held.epoch, "stop")
            if release and await self.board.release(stream_id, held.epoch):
                await self.board.log(stream_id, held.epoch, event)

    def forget(self, stream_id: str) -> int | None:
        """The stream was stopped here by the API: its epoch, no longer held (release it)."""
        held = self.held.pop(stream_id, None)
        return held.epoch if held is not None else None

    async def release_all(self) -> None:
        for sid in list(self.held):
            await self.give_up(sid, "release")

    async def _sync_snapshots(self, stop: asyncio.Event) -> None:
        """Copy each held stream's newest snapshot to Redis (fenced by its epoch)."""
        while not stop.is_set():
            for sid, held in list(self.held.items()):
                snap = self.hooks.snapshot(sid)
                if snap is None or snap is held.synced:
                    continue
                try:
                    ok = await self.board.put_snapshot(sid, held.epoch, snap,
                                                       self.settings.snapshot_ttl_s)  # fmt: skip
                except REDIS_ERRORS:
                    break  # the tick notices and logs Redis failing
                if ok:
                    held.synced = snap
            await _wait(stop, SNAPSHOT_SYNC_S)

    def describe(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "live_replicas": self.live,
            "streams": {sid: h.epoch for sid, h in sorted(self.held.items())},
            "takeovers": self.takeovers,
            "lost": self.lost,
        }


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
