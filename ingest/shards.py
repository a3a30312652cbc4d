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
as fast as possible, at the snapshot's frame (the few answered after it are sent
again, in the new epoch), its tracker clock bridging only the restart.

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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from framerelay.errors import FramerelayError
from framerelay.protocol import SessionSnapshot
from ingest.leases import LeaseBoard, Route
from ingest.resume import ResumeAt
from ingest.settings import StreamConfig
from ingest.shard_settings import ShardSettings

log = logging.getLogger(__name__)
SNAPSHOT_SYNC_S = 0.2
"""New snapshots are looked for at every result, and at least this often (each is written
once): a takeover resumes from the newest, or ids born after it would be handed out again
by the resumed tracker."""
SNAPSHOT_AFTER_RESULT_S = 0.01
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
        [StreamConfig, SessionSnapshot | None, ResumeAt | None, Route | None], Awaitable[None]
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
        self.routes: dict[str, Route] = {}
        """The orchestrator's placements as last read from Redis."""
        self._failing: str | None = None
        self._fresh = asyncio.Event()
        """A result came in: its stream's snapshot may be new (copy it before waiting)."""

    def result_seen(self, _record: object) -> None:
        """A bus tap: wake the snapshot copier (the worker sends a frame's snapshot before
        its result, so the snapshot reaches Redis about as soon as the result does)."""
        self._fresh.set()

    @property
    def replica(self) -> str:
        return self.board.replica

    async def run(self, stop: asyncio.Event) -> None:
        """Coordinate until ``stop``; then stop our streams and release their leases.

        The leases are kept by a task of their own: a tick that starts streams can take
        longer than a lease lives (opening sources on a busy machine), and a lease it
        left unrenewed meanwhile would expire in Redis while the stream still ran here."""
        sync = asyncio.create_task(self._sync_snapshots(stop), name="shard-snapshots")
        keeper = asyncio.create_task(self._keep_leases(stop), name="shard-leases")
        try:
            await self._guarded(self.board.heartbeat)
            await _wait(stop, self.settings.renew_interval_s)  # let peers that start with us show
            while not stop.is_set():
                await self._guarded(self.tick)
                await _wait(stop, self.settings.renew_interval_s)
        finally:
            stop.set()
            await asyncio.gather(sync, keeper, return_exceptions=True)
            await self.release_all()

    async def _keep_leases(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._guarded(self.keep)
            await _wait(stop, self.settings.renew_interval_s)

    async def keep(self) -> None:
        """Renew the leases of our streams; stop those lost or not renewed in time."""
        await self._renew()
        await self._expire_unrenewed()

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
        """Heartbeat, follow the wanted streams and routes, take free ones, shed extras
        (the leases held are kept by :meth:`keep`, on their own clock)."""
        self.live = await self.board.heartbeat()
        self.routes = await self.board.routes()  # before wanted: routes bring definitions
        wanted = await self.hooks.wanted()
        for sid in [s for s in self.held if s not in wanted]:
            await self.give_up(sid, "release")
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
        if config.id in self.held:
            return True
        sent = time.monotonic()
        epoch = await self.board.acquire(config.id)
        if epoch == 0:
            return False
        held = Held(epoch, sent + self.settings.lease_ttl_s * SAFE_FRACTION)
        self.held[config.id] = held
        snap = await self.board.snapshot(config.id)
        resume = self._resume_at(config, snap)
        if snap is not None and not self.hooks.realtime(config):
            snap = _rebased(snap)
        if route is not None:
            self.routes[config.id] = route
        route = route or self.routes.get(config.id)
        try:
            await self.hooks.start(config, snap, resume, route)
        except (FramerelayError, ValueError) as exc:
            log.error("shards: stream %s not started: %s", config.id, exc)
            await self._drop(config.id, "release", release=True)
            return False
        if self.held.get(config.id) is not held:  # lost while it started: not ours to run
            log.warning("shards: lost the lease of stream %s while starting it", config.id)
            await self.hooks.stop(config.id)
            return False
        self.takeovers += snap is not None
        await self.board.log(config.id, epoch, "start")
        log.info("shards: %s runs stream %s (epoch %d, snapshot: %s, from %s s)", self.replica,
                 config.id, epoch, snap is not None, resume)  # fmt: skip
        return True

    def _resume_at(self, config: StreamConfig, snap: SessionSnapshot | None) -> ResumeAt | None:
        """Where a file resumes: the snapshot's last frame; for a file paced like a live
        camera, moving on in real time from its capture. None: from the start."""
        if snap is None or snap[0].epoch is None or snap[0].last_t < -1e17:
            return None
        clock = snap[0]
        at = max(0.0, clock.last_t - clock.offset)
        if self.hooks.realtime(config) and clock.last_captured > 0:
            since = max(clock.last_captured, time.time() - 3600.0)
            return ResumeAt(at, since)
        return ResumeAt(at)

    async def _apply_routes(self) -> None:
        for sid, route in self.routes.items():
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
            self._fresh.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SNAPSHOT_SYNC_S):
                    await self._fresh.wait()
            await asyncio.sleep(SNAPSHOT_AFTER_RESULT_S)  # the worker sends it after the result
            await self._copy_snapshots()

    async def _copy_snapshots(self) -> None:
        for sid, held in list(self.held.items()):
            snap = self.hooks.snapshot(sid)
            if snap is None or snap is held.synced:
                continue
            try:
                ok = await self.board.put_snapshot(sid, held.epoch, snap,
                                                   self.settings.snapshot_ttl_s)  # fmt: skip
            except REDIS_ERRORS:
                return  # the tick notices and logs Redis failing
            if ok:
                held.synced = snap

    def describe(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "live_replicas": self.live,
            "streams": {sid: h.epoch for sid, h in sorted(self.held.items())},
            "takeovers": self.takeovers,
            "lost": self.lost,
        }


class ShardCollector:
    """Prometheus: the streams this replica holds (with their epochs), the live replicas,
    takeovers and lost leases."""

    def __init__(self, coordinator: ShardCoordinator) -> None:
        self._c = coordinator

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        c, p = self._c, "framerelay_ingest_shard_"
        held = GaugeMetricFamily(p + "stream_epoch", "Lease epoch of each stream this "
                                 "replica runs", labels=["stream", "replica"])  # fmt: skip
        for sid, h in sorted(c.held.items()):
            held.add_metric([sid, c.replica], float(h.epoch))
        yield held
        yield GaugeMetricFamily(p + "live_replicas", "Live ingest replicas", value=len(c.live))
        yield CounterMetricFamily(p + "takeovers", "Streams resumed here from a shared "
                                  "snapshot", value=c.takeovers)  # fmt: skip
        lost = "Streams stopped here: their lease was lost or not renewed in time"
        yield CounterMetricFamily(p + "lost_leases", lost, value=c.lost)


def _rebased(snap: SessionSnapshot) -> SessionSnapshot:
    """A file read as fast as possible resumes at its last frame: the worker bridges the
    new epoch by the capture-time gap, so make that gap the restart's, not the outage's
    (the scene did not move while nobody read the file)."""
    clock = msgspec.structs.replace(snap[0], last_captured=time.time())
    return clock, snap[1]


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
