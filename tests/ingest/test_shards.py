"""Sharded ingests (ingest.leases, ingest.shards) against the real Redis on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from framerelay import wire
from framerelay.protocol import SessionSnapshot
from ingest.leases import LeaseBoard, Route
from ingest.resume import ResumeAt
from ingest.settings import IngestSettings, StreamConfig
from ingest.shard_settings import ShardSettings
from ingest.shards import ShardCoordinator, ShardHooks, _rebased
from tests.conftest import REDIS_URL, RedisSpace

pytestmark = pytest.mark.integration
TTL_S = 0.4


def _snap(last_t: float = 12.0) -> SessionSnapshot:
    return wire.SessionClock(epoch=3, offset=2.0, last_t=last_t, last_captured=1.0e9), b"blob"


async def test_a_lease_is_held_by_one_replica_and_fenced_after_expiry(
    redis_space: RedisSpace,
) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    a, b = (LeaseBoard(client, prefix, name, TTL_S) for name in ("a", "b"))
    assert await a.acquire("cam") == 1
    assert await b.acquire("cam") == 0
    assert await a.acquire("cam") == 1  # ours already: same epoch
    assert await a.renew("cam", 1) and not await b.renew("cam", 1)
    assert await a.put_snapshot("cam", 1, _snap(), 60)
    await asyncio.sleep(TTL_S + 0.2)  # a died: its lease expires
    assert await b.acquire("cam") == 2
    assert not await a.renew("cam", 1)
    assert not await a.put_snapshot("cam", 1, _snap(99.0), 60)  # fenced off
    assert not await a.release("cam", 1)
    got = await b.snapshot("cam")
    assert got is not None and got[0].last_t == 12.0 and got[1] == b"blob"
    assert await b.owners(["cam", "other"]) == {"cam": ("b", 2)}
    assert await b.release("cam", 2) and await b.owners(["cam"]) == {}


async def test_replicas_are_live_while_they_heartbeat(redis_space: RedisSpace) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    a, b = (LeaseBoard(client, prefix, name, TTL_S) for name in ("a", "b"))
    await a.heartbeat()
    assert await b.heartbeat() == ["a", "b"]
    await asyncio.sleep(TTL_S + 0.2)
    assert await b.heartbeat() == ["b"]


async def test_routes_are_shared(redis_space: RedisSpace) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    a, b = (LeaseBoard(client, prefix, name, TTL_S) for name in ("a", "b"))
    route = Route("gpu-1", "ws://127.0.0.1:1/v1/tunnel", None, {"id": "cam", "url": "x.mp4"})
    await a.put_route("cam", route)
    assert await b.routes() == {"cam": route}
    await b.drop_route("cam")
    assert await a.routes() == {}


class FakeService:
    """The coordinator's hooks, recording what it asked."""

    def __init__(self, streams: list[str]) -> None:
        self.configs = {s: StreamConfig(id=s, url=f"{s}.mp4", realtime=True) for s in streams}
        self.running: dict[str, tuple[SessionSnapshot | None, ResumeAt | None]] = {}
        self.snaps: dict[str, SessionSnapshot] = {}
        self.start_s: dict[str, float] = {}
        """How long starting a stream takes (default: at once)."""

    def hooks(self) -> ShardHooks:
        async def wanted() -> dict[str, StreamConfig]:
            return dict(self.configs)

        async def start(cfg: StreamConfig, snap: Any, at: Any, route: Any) -> None:
            await asyncio.sleep(self.start_s.get(cfg.id, 0.0))  # opening a slow source
            self.running[cfg.id] = (snap, at)

        async def stop(sid: str) -> None:
            self.running.pop(sid, None)

        async def noop(*_: Any) -> None:
            return None

        return ShardHooks(wanted=wanted, start=start, stop=stop, snapshot=self.snaps.get,
                          route=noop, running=lambda s: s in self.running, update=noop)  # fmt: skip


def _coordinator(client: Redis, prefix: str, name: str, svc: FakeService) -> ShardCoordinator:
    settings = ShardSettings(replica_id=name, lease_ttl_s=TTL_S * 2, renew_interval_s=0.1,
                             rebalance_interval_s=0.1, prefix=prefix)  # fmt: skip
    board = LeaseBoard(client, prefix, name, settings.lease_ttl_s)
    return ShardCoordinator(board, settings, svc.hooks())


async def test_fair_share_then_takeover_with_the_snapshot(redis_space: RedisSpace) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    streams = [f"cam-{i}" for i in range(4)]
    sa, sb = FakeService(streams), FakeService(streams)
    a, b = _coordinator(client, prefix, "a", sa), _coordinator(client, prefix, "b", sb)
    await a.board.heartbeat()
    await b.board.heartbeat()
    await a.tick()
    await b.tick()
    assert len(sa.running) == len(sb.running) == 2
    assert not set(sa.running) & set(sb.running)
    for sid in sa.running:
        sa.snaps[sid] = _snap()
    await asyncio.sleep(0.3)  # the snapshot sync is part of run(); copy them as it would
    for sid, held in a.held.items():
        assert await a.board.put_snapshot(sid, held.epoch, sa.snaps[sid], 60)
    deadline = asyncio.get_running_loop().time() + 5
    while len(sb.running) < 4:  # a stopped renewing (kill -9): b takes its streams over
        assert asyncio.get_running_loop().time() < deadline, sb.running
        await b.tick()
        await asyncio.sleep(0.1)
    for sid in sa.running:
        snap, at = sb.running[sid]
        assert snap is not None and snap[0].last_t == 12.0
        assert at is not None and at.now() > 10.0  # past the snapshot's frame (pts 10 s)
        assert b.held[sid].epoch == 2


async def test_a_lost_lease_stops_the_stream(redis_space: RedisSpace) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    svc = FakeService(["cam"])
    a = _coordinator(client, prefix, "a", svc)
    await a.tick()
    assert "cam" in svc.running
    await client.set(f"{prefix}:lease:cam", "b|7")  # another replica holds it now
    await a.keep()
    assert "cam" not in svc.running and a.lost == 1


async def test_a_replica_over_its_share_hands_one_stream_over(redis_space: RedisSpace) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    streams = ["cam-0", "cam-1"]
    sa, sb = FakeService(streams), FakeService(streams)
    a, b = _coordinator(client, prefix, "a", sa), _coordinator(client, prefix, "b", sb)
    await a.tick()
    assert len(sa.running) == 2  # alone: everything
    await b.board.heartbeat()
    await a.tick()  # now over its share of 1: releases one
    await b.tick()
    assert len(sa.running) == len(sb.running) == 1


async def test_leases_stay_renewed_while_slow_starts_hold_up_the_tick(
    redis_space: RedisSpace,
) -> None:
    """Regression (CI, two ingests on a busy machine): a tick that started streams for longer
    than a lease lives left the leases it held unrenewed; one expired in Redis while its
    stream still ran, the peer took it and both ran it. The leases have their own task now."""
    client, prefix = redis_space.client, redis_space.prefix
    svc = FakeService(["cam-0"])
    a = _coordinator(client, prefix, "a", svc)
    stop = asyncio.Event()
    running = asyncio.create_task(a.run(stop))
    lease = f"{prefix}:lease:cam-0"
    try:
        await _until(lambda: "cam-0" in svc.running, 5.0)
        for sid in ("cam-1", "cam-2", "cam-3"):  # three more, each as slow to open as a lease
            svc.configs[sid] = StreamConfig(id=sid, url=f"{sid}.mp4", realtime=True)
            svc.start_s[sid] = TTL_S * 2
        seen: set[bytes | str | None] = set()
        for _ in range(int(TTL_S * 2 * 4 / 0.02)):  # the three slow starts, sampled
            seen.add(await client.get(lease))
            await asyncio.sleep(0.02)
        assert "cam-0" in svc.running and a.lost == 0
        assert None not in seen, "the running stream's lease expired in Redis"
    finally:
        stop.set()
        await running


async def test_a_lease_lost_while_its_stream_starts_leaves_it_stopped(
    redis_space: RedisSpace,
) -> None:
    client, prefix = redis_space.client, redis_space.prefix
    svc = FakeService(["cam"])
    svc.start_s["cam"] = TTL_S
    a = _coordinator(client, prefix, "a", svc)
    claiming = asyncio.create_task(a.claim(svc.configs["cam"]))
    await _until(lambda: "cam" in a.held, 5.0)
    await client.set(f"{prefix}:lease:cam", "b|7")  # taken by another while it opens
    await a.keep()
    assert await claiming is False
    assert "cam" not in svc.running and "cam" not in a.held
    log = cast("list[tuple[bytes, dict[bytes, bytes]]]", await client.xrange(f"{prefix}:log"))
    assert [f[b"event"] for _, f in log] == [b"acquire", b"stop"]  # never a start


async def _until(cond: Callable[[], bool], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "not within the limit"
        await asyncio.sleep(0.01)


def test_shards_need_redis_and_sane_times() -> None:
    with pytest.raises(ValidationError, match="needs FRAMERELAY_REDIS_URL"):
        IngestSettings(shards={"enabled": True})
    with pytest.raises(ValidationError, match="at most a quarter"):
        ShardSettings(lease_ttl_s=2, renew_interval_s=1)
    assert not IngestSettings().shards.enabled


@pytest.mark.parametrize(
    ("realtime", "lo", "hi"), [(True, 10.0 + 5.0, 10.0 + 7.0), (False, 10.0, 10.0)]
)
def test_where_a_taken_over_file_resumes(realtime: bool, lo: float, hi: float) -> None:
    """The snapshot's frame is at pts 10 s (last_t 12 - offset 2), captured 6 s ago."""
    svc = FakeService([])
    coordinator = _coordinator(Redis.from_url(REDIS_URL), "unused", "a", svc)
    cfg = StreamConfig(id="cam", url="cam.mp4", realtime=realtime)
    clock = wire.SessionClock(epoch=3, offset=2.0, last_t=12.0, last_captured=time.time() - 6)
    resume = coordinator._resume_at(cfg, (clock, b""))
    assert resume is not None and lo <= resume.now() <= hi
    rebased = _rebased((clock, b""))[0]
    assert rebased.last_t == 12.0 and time.time() - rebased.last_captured < 1
