"""The overload rig, shared by ``tests/integration/test_overload.py`` and
``bench/overload.py``: a real 1-thread worker process, an in-process ingest
playing the sample clip as N real-time streams (every frame), and one sample
per result.

Latency under overload is ``frames in the system x the worker's time per
frame``. The first factor is what credits bound; the second is the machine's
speed, which on these shared 2-core VMs drifts by up to a third within one
minute with nothing else running (a 1-thread worker measured 42 then 31
results/s in the same run). So each window reports both the raw latency and
the frames in the system (Little's law: results/s x mean latency), which a
queue makes grow and a slower CPU does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bench.rig.common import CLIP
from framerelay.lifecycle import startup_heap_frozen
from framerelay.results import ResultRecord
from ingest.service import IngestService
from ingest.settings import IngestSettings, StreamConfig

CLIP_FPS = 25.0
WINDOW_S = 20.0


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() when the result reached the ingest
    latency_ms: float  # capture on the ingest -> result back on the ingest
    infer_ms: float  # the worker's inference time for the batch holding this frame


@dataclass(frozen=True)
class Run:
    samples: list[Sample]
    counts: dict[str, dict[str, int]]  # per stream: the ingest's counters
    loop_lag: list[tuple[float, float]]  # (when, ms): the ingest's event loop ran late
    gc_pauses: list[tuple[float, float]]  # (when, ms): this process's garbage collections
    outstanding: list[tuple[float, int]]  # (when, frames sent and not yet answered, all streams)


class _Watch:
    """Every 10 ms: the frames the ingest has in flight (all streams) and how late the
    event loop woke; GC pauses over 1 ms. What stalls the ingest (this process) shows."""

    TICK_S = 0.01

    def __init__(self, service: IngestService) -> None:
        self.service = service
        self.loop_lag: list[tuple[float, float]] = []
        self.gc_pauses: list[tuple[float, float]] = []
        self.outstanding: list[tuple[float, int]] = []
        self._gc_start = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._gc_start = now
        elif (ms := (now - self._gc_start) * 1000) > 1:
            self.gc_pauses.append((now, ms))

    async def watch(self, stop: asyncio.Event) -> None:
        gc.callbacks.append(self._on_gc)
        try:
            while not stop.is_set():
                t = time.monotonic()
                n = sum(len(s.window.inflight) for s in self.service.streams.values())
                self.outstanding.append((t, n))
                await asyncio.sleep(self.TICK_S)
                if (late := (time.monotonic() - t - self.TICK_S) * 1000) > 5:
                    self.loop_lag.append((t, late))
        finally:
            gc.callbacks.remove(self._on_gc)


@dataclass(frozen=True)
class Window:
    """The results that came back in [start, start + seconds)."""

    n: int
    rate: float  # results/s: what the worker served
    mean_ms: float
    p50_ms: float
    p99_ms: float
    infer_p50_ms: float
    loop_lag_ms: float  # the ingest event loop's longest stall
    gc_ms: float  # the ingest's longest garbage collection
    outstanding_max: int  # most frames sent and not yet answered at once (all streams)

    @property
    def in_flight(self) -> float:
        """Frames in the system on average (Little's law)."""
        return self.rate * self.mean_ms / 1000

    @property
    def p50_frames(self) -> float:
        """Median latency counted in the worker's own time per result."""
        return self.p50_ms * self.rate / 1000

    @property
    def p99_frames(self) -> float:
        """p99 latency counted in the worker's own time per result."""
        return self.p99_ms * self.rate / 1000


async def run_streams(
    url: str, secret: str, streams: int, seconds: float, *, realtime: bool = True, fps: float = 0
) -> Run:
    """``streams`` streams of the clip for ``seconds``; ``fps`` > 0 samples each (0: every
    frame)."""
    configs = [
        StreamConfig(id=f"cam-{i}", url=str(CLIP), fps=fps, realtime=realtime, loop=True)
        for i in range(streams)
    ]
    settings = IngestSettings(
        worker_url=url, token_secrets=secret, worker_id="test-worker", streams=configs
    )
    service = IngestService(settings)
    samples: list[Sample] = []

    def record(r: ResultRecord) -> None:
        samples.append(Sample(time.monotonic(), r.latency_ms, r.timings.get("infer_ms", 0.0)))

    service.bus.tap(record)
    stop = asyncio.Event()
    watch = _Watch(service)
    watcher = asyncio.create_task(watch.watch(stop))
    task = asyncio.create_task(service.run(stop))
    with startup_heap_frozen():  # as ``framerelay ingest`` runs (ingest.app.serve_ingest)
        await asyncio.sleep(seconds)
        stop.set()
        await task
        await watcher
    counts = {sid: dict(s.counters) for sid, s in service.streams.items()}
    return Run(samples, counts, watch.loop_lag, watch.gc_pauses, watch.outstanding)


def _longest(events: Sequence[tuple[float, float]], start: float, seconds: float) -> float:
    return max((ms for t, ms in events if start <= t < start + seconds), default=0.0)


def window(run: Run, start: float, seconds: float = WINDOW_S) -> Window:
    """The results of ``run`` in ``[start, start + seconds)``: at least two a second (a
    worker slowed by a busy machine served 6 a second in one 12 s window)."""
    inside = [s for s in run.samples if start <= s.t < start + seconds]
    least = 2 * seconds
    assert len(inside) > least, f"only {len(inside)} results in {seconds:.0f} s from {start:.0f}"
    lat = np.array([s.latency_ms for s in inside])
    return Window(
        n=len(inside),
        rate=len(inside) / seconds,
        mean_ms=float(lat.mean()),
        p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, 99)),
        infer_p50_ms=float(np.percentile([s.infer_ms for s in inside], 50)),
        loop_lag_ms=_longest(run.loop_lag, start, seconds),
        gc_ms=_longest(run.gc_pauses, start, seconds),
        outstanding_max=int(_longest(run.outstanding, start, seconds)),
    )


def capacity(run: Run) -> float:
    """Results/s of a file read as fast as the credits allow."""
    done = [s.t for s in run.samples]
    return (len(done) - 1) / (done[-1] - done[0])


def streams_for(capacity_fps: float, overload: float, max_streams: int) -> int:
    return min(max_streams, max(4, round(overload * capacity_fps / CLIP_FPS)))


def alone_fps(capacity_fps: float) -> float:
    """The lone stream's rate: every frame of the clip where the worker serves at least
    twice that, else half the capacity (a busy machine's worker may serve fewer than
    25 frames/s: the clip's every frame would then overload it alone)."""
    return CLIP_FPS if capacity_fps >= 2 * CLIP_FPS else capacity_fps / 2


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (threads made later inherit from their creator)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def separate_cores(worker_pid: int, pin: bool) -> Iterator[None]:
    """The worker on the last core, this process (the ingest) on the others."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or not pin:
        yield
        return
    _pin(worker_pid, {cpus[-1]})
    _pin(os.getpid(), set(cpus[:-1]))
    try:
        yield
    finally:
        _pin(os.getpid(), set(cpus))


@dataclass(frozen=True)
class Overload:  # frozen + cached_property: the windows are computed once
    """One overload experiment: capacity, one stream alone, then N streams."""

    capacity: float
    streams: int
    alone: Run
    loaded: Run
    window_s: float = WINDOW_S
    """The length of each compared window (unloaded, first, last)."""
    alone_fps: float = CLIP_FPS
    """The lone stream's rate (:func:`alone_fps`)."""

    @functools.cached_property
    def unloaded(self) -> Window:
        t0 = self.alone.samples[0].t
        return window(self.alone, t0 + 2, self.window_s)

    @property
    def alone_replaced(self) -> float:
        """The share of the lone stream's frames (those kept by its sampling) replaced
        before they were sent."""
        return replaced_share(self.alone)

    @property
    def loaded_replaced(self) -> float:
        """The same share over the loaded run's streams."""
        return replaced_share(self.loaded)

    @functools.cached_property
    def first(self) -> Window:
        return window(self.loaded, self.loaded.samples[0].t, self.window_s)

    @functools.cached_property
    def last(self) -> Window:
        t0 = self.loaded.samples[0].t
        return window(self.loaded, t0 + 2 * self.window_s, self.window_s)

    @property
    def offered_fps(self) -> float:
        return self.streams * CLIP_FPS

    @property
    def served_fps(self) -> float:
        t0 = self.loaded.samples[0].t
        span = 3 * self.window_s
        return sum(1 for s in self.loaded.samples if t0 <= s.t < t0 + span) / span

    @property
    def bound_ms(self) -> float:
        """The p99 ceiling: 1.5 x streams x the unloaded p99."""
        return 1.5 * self.streams * self.unloaded.p99_ms

    def report(self) -> str:
        f, la, u = self.first, self.last, self.unloaded
        return "\n".join(
            [
                f"capacity {self.capacity:.1f} fps; {self.streams} streams offered "
                f"{self.offered_fps:.0f} fps, served {self.served_fps:.1f} fps "
                f"({self.offered_fps / self.served_fps:.1f}x); unloaded ({self.alone_fps:.1f} "
                f"fps) p99 {u.p99_ms:.1f} ms; frames replaced: alone "
                f"{self.alone_replaced:.1%}, loaded {self.loaded_replaced:.1%}",
                "window        results/s  p50 ms  p99 ms  infer p50 ms  in flight"
                "  p50 / p99 in frames  ingest stall / gc ms  most outstanding",
                _row(f"first {self.window_s:.0f} s", f),
                _row(f"last {self.window_s:.0f} s", la),
                f"ratios last/first: p99 {la.p99_ms / f.p99_ms:.2f}, in flight "
                f"{la.in_flight / f.in_flight:.2f}, p50 / p99 in frames "
                f"{la.p50_frames / f.p50_frames:.2f} / {la.p99_frames / f.p99_frames:.2f}, "
                f"worker speed {la.rate / f.rate:.2f}",
                f"bound 1.5 x {self.streams} x unloaded p99 = {self.bound_ms:.1f} ms; p99 over "
                f"the unloaded p99: first {f.p99_ms / u.p99_ms:.2f}x, last "
                f"{la.p99_ms / u.p99_ms:.2f}x (bound {1.5 * self.streams:.1f}x)",
            ]
        )


def replaced_share(run: Run) -> float:
    """Frames replaced at the sender over the frames kept by sampling, all streams."""
    kept = sum(c["decoded"] - c["sampled_out"] for c in run.counts.values())
    return sum(c["replaced"] for c in run.counts.values()) / kept if kept else 0.0


def _row(name: str, w: Window) -> str:
    return (
        f"{name:12s} {w.rate:10.1f} {w.p50_ms:7.1f} {w.p99_ms:7.1f} {w.infer_p50_ms:13.1f} "
        f"{w.in_flight:10.2f} {w.p50_frames:9.2f} / {w.p99_frames:5.2f} "
        f"{w.loop_lag_ms:12.0f} / {w.gc_ms:4.0f} {w.outstanding_max:17d}"
    )


def measure(
    url: str,
    secret: str,
    worker_pid: int,
    *,
    overload: float,
    max_streams: int,
    pin: bool,
    window_s: float = WINDOW_S,
) -> Overload:
    """Capacity (one file as fast as possible), one stream alone for a window (at most
    half the capacity: :func:`alone_fps`), then enough streams for ``overload`` x the
    capacity for three windows (first, -, last)."""
    with separate_cores(worker_pid, pin):  # capacity as the loaded run will see it
        flat_out = asyncio.run(run_streams(url, secret, 1, max(6.0, window_s / 2), realtime=False))
    cap = capacity(flat_out)
    streams = streams_for(cap, overload, max_streams)
    # one stream needs no core of its own: the ingest keeps both (the worker stays pinned)
    fps = alone_fps(cap)
    sampled = 0.0 if fps == CLIP_FPS else fps
    alone = asyncio.run(run_streams(url, secret, 1, 2 + window_s, fps=sampled))
    with separate_cores(worker_pid, pin):
        loaded = asyncio.run(run_streams(url, secret, streams, 3 * window_s + 2))
    return Overload(cap, streams, alone, loaded, window_s, fps)
