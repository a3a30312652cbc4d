"""The last hour of every stream, kept by the ingest itself (``GET /v1/history``).

The operator console's History panel draws these, so it works without
Prometheus. Every ``interval_s`` (10 s) :class:`HistorySampler` writes one
point per series, per stream and for all streams together:

* ``fps_in``: frames decoded per second over the interval;
* ``fps_out``: results received per second;
* ``drops``: frames dropped in the interval, the sum of :data:`DROP_REASONS`
  (the progress line's: decoded frames that never got a result, for a reason
  other than sampling: ``no_credit``, ``behind``, ``replaced``,
  ``disconnected``, ``timeout``, ``worker_error``, ``out_of_range``). Sampling
  (``sampled_out``) is by design, not a drop; ``decode_error``,
  ``encode_error`` and ``corrupt`` are failures, shown by the stream's
  counters;
* ``latency_p50_ms`` / ``latency_p99_ms``: of the results received in the
  interval only (null when none came): the newest ``n`` values of the
  stream's latency window, ``n`` being how many results arrived since the
  last point (both move together on the event loop).

Memory is fixed at creation: the timestamps and each stream's series are
preallocated arrays of ``points`` doubles (360: one hour), written
round-robin, so 10,000 samples leave exactly 360 points. At most
``max_streams`` streams have series of their own (the others count in the
totals only), and a stream no longer in the ingest is forgotten at the next
point. A stream that started after the oldest point has nulls before it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.openapi_docs import errors
from framerelay.schemas import STREAM_ID_PATTERN
from ingest.stats import DROP_REASONS
from ingest.window import FloatWindow

POINTS = 360
INTERVAL_S = 10.0
MAX_STREAMS = 1024
"""Streams with series of their own (14 KiB each at 360 points); the rest count in totals."""
SERIES = ("fps_in", "fps_out", "drops", "latency_p50_ms", "latency_p99_ms")
NAN = math.nan


class Sampled(Protocol):
    """What the sampler reads of a stream (an :class:`~ingest.stream.IngestStream`)."""

    counters: dict[str, int]
    latency_ms: FloatWindow


class Series(BaseModel):
    """One value per timestamp, oldest first; null where there is none."""

    model_config = ConfigDict(extra="forbid")

    fps_in: list[float | None] = Field(description="Frames decoded per second.")
    fps_out: list[float | None] = Field(description="Results received per second.")
    drops: list[float | None] = Field(description="Frames dropped in the interval.")
    latency_p50_ms: list[float | None] = Field(description="Median latency of its results.")
    latency_p99_ms: list[float | None] = Field(description="99th percentile of the same.")


class History(BaseModel):
    """The last hour: timestamps and, aligned with them, the series."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(description="Seconds between two points.")
    points: int = Field(description="The most points kept (one hour).")
    drop_reasons: list[str] = Field(description="The counters summed as drops.")
    timestamps: list[float] = Field(description="Unix time of each point, oldest first.")
    total: Series = Field(description="All streams together.")
    streams: dict[str, Series] = Field(description="Per stream (only the one asked for).")


@dataclass(slots=True)
class _Point:
    """One stream's counts over one interval."""

    decoded: int
    results: int
    drops: int
    latencies: list[float]


@dataclass(slots=True)
class _Track:
    """A stream's baseline counters and its series (one flat preallocated array)."""

    stream: Sampled
    decoded: int
    results: int
    drops: int
    values: array.array[float]


def _drops(counters: Mapping[str, int]) -> int:
    return sum(counters[k] for k in DROP_REASONS)


def _newest(window: FloatWindow, n: int) -> list[float]:
    """The latencies of the ``n`` results since the last point (a full window at most)."""
    return window.last(min(n, window.size)) if n > 0 else []


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return NAN, NAN
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), (50, 99))
    return float(p50), float(p99)


def _public(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


class HistorySampler:
    """Fixed-memory rings of per-stream and total series (see the module)."""

    def __init__(
        self, points: int = POINTS, interval_s: float = INTERVAL_S, max_streams: int = MAX_STREAMS
    ) -> None:
        if points < 1 or not interval_s > 0 or max_streams < 0:
            raise ValueError("history needs points >= 1, interval_s > 0, max_streams >= 0")
        self.points, self.interval_s, self.max_streams = points, interval_s, max_streams
        self._times = array.array("d", [NAN]) * points
        self._total = self._ring()
        self._tracks: dict[str, _Track] = {}
        self._next = 0
        self._count = 0
        self._last_mono: float | None = None

    def _ring(self) -> array.array[float]:
        return array.array("d", [NAN]) * (len(SERIES) * self.points)

    @property
    def tracked(self) -> int:
        """Streams with series of their own."""
        return len(self._tracks)

    def __len__(self) -> int:
        """Points held (at most ``points``)."""
        return self._count

    def sample(self, streams: Mapping[str, Sampled], at: float, mono: float) -> None:
        """Write one point: ``at`` is its Unix time, ``mono`` a monotonic clock (the
        interval since the last point; ``interval_s`` for the first)."""
        dt = self.interval_s if self._last_mono is None else max(mono - self._last_mono, 1e-6)
        self._last_mono = mono
        for sid in [s for s, t in self._tracks.items() if streams.get(s) is not t.stream]:
            del self._tracks[sid]  # deleted or replaced: forgotten (a new one restarts)
        slot = self._next
        points = [self._point(sid, s, dt, slot) for sid, s in list(streams.items())]
        merged = [v for p in points for v in p.latencies]
        self._write(self._total, slot, dt, _Point(
            sum(p.decoded for p in points), sum(p.results for p in points),
            sum(p.drops for p in points), merged,
        ))  # fmt: skip
        self._times[slot] = at
        self._next = (slot + 1) % self.points
        self._count = min(self._count + 1, self.points)

    def _point(self, sid: str, stream: Sampled, dt: float, slot: int) -> _Point:
        c = stream.counters
        track = self._tracks.get(sid)
        base = (track.decoded, track.results, track.drops) if track else (0, 0, 0)
        now = (c["decoded"], c["results"], _drops(c))
        new_results = now[1] - base[1]
        point = _Point(now[0] - base[0], new_results, now[2] - base[2],
                       _newest(stream.latency_ms, new_results))  # fmt: skip
        if track is None and len(self._tracks) < self.max_streams:
            track = self._tracks[sid] = _Track(stream, *now, self._ring())
        if track is not None:
            track.decoded, track.results, track.drops = now
            self._write(track.values, slot, dt, point)
        return point

    def _write(self, ring: array.array[float], slot: int, dt: float, point: _Point) -> None:
        p50, p99 = _percentiles(point.latencies)
        row = (point.decoded / dt, point.results / dt, float(point.drops), p50, p99)
        for k, value in enumerate(row):
            ring[k * self.points + slot] = value

    def _order(self) -> list[int]:
        start = (self._next - self._count) % self.points
        return [(start + i) % self.points for i in range(self._count)]

    def _series(self, ring: array.array[float] | None, order: list[int]) -> Series:
        def one(k: int) -> list[float | None]:
            if ring is None:
                return [None] * len(order)
            return [_public(ring[k * self.points + i]) for i in order]

        return Series.model_validate({name: one(k) for k, name in enumerate(SERIES)})

    def read(self, stream_ids: Sequence[str] | None = None) -> History:
        """The points held, oldest first: the totals, and the series of ``stream_ids``
        (default: every stream tracked; one not tracked yet has nulls)."""
        order = self._order()
        ids = list(self._tracks) if stream_ids is None else list(stream_ids)
        return History(
            interval_s=self.interval_s, points=self.points, drop_reasons=list(DROP_REASONS),
            timestamps=[self._times[i] for i in order], total=self._series(self._total, order),
            streams={s: self._series(self._ring_of(s), order) for s in ids},
        )  # fmt: skip

    def _ring_of(self, stream_id: str) -> array.array[float] | None:
        track = self._tracks.get(stream_id)
        return track.values if track is not None else None

    async def run(self, streams: Mapping[str, Sampled], stop: asyncio.Event) -> None:
        """Sample ``streams`` (a live view) every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()
            if not stop.is_set():
                self.sample(streams, time.time(), time.monotonic())


StreamQuery = Annotated[
    str | None,
    Query(pattern=STREAM_ID_PATTERN, description="Only this stream's series (and the totals)."),
]

TotalsQuery = Annotated[
    bool,
    Query(description="Only the totals, no stream's series (what the console's charts read)."),
]


def history_router(
    sampler: HistorySampler, streams: Mapping[str, object], api: ApiAuth
) -> APIRouter:
    """``GET /v1/history[?stream=ID]`` (``streams:read``); ``streams``: the ingest's."""
    router = APIRouter(route_class=AuthFirstRoute)

    @router.get("/v1/history", tags=["streams"], dependencies=[api.requires("streams:read")],
                summary="The last hour of fps, drops and latency",
                responses=errors(404, e404="No stream with this id"))  # fmt: skip
    async def history(stream: StreamQuery = None, totals_only: TotalsQuery = False) -> History:
        """A point every 10 s over the last hour, for all streams together and per stream:
        fps in (decoded) and out (results), frames dropped, latency p50/p99 of the results
        of each interval. Kept by the ingest (no Prometheus needed)."""
        if stream is None:
            return sampler.read([] if totals_only else None)
        if stream not in streams:
            raise HTTPException(404, f"no stream {stream!r}")
        return sampler.read([stream])

    return router
