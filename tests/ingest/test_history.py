"""HistorySampler: an hour of per-stream and total series in fixed memory, with a fake clock."""

from __future__ import annotations

import asyncio
import math
import tracemalloc
from dataclasses import dataclass, field

import pytest

from ingest.history import HistorySampler
from ingest.stream import COUNTERS
from ingest.window import FloatWindow


@dataclass
class FakeStream:
    """What the sampler reads of an IngestStream: counters and the latency window."""

    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    latency_ms: FloatWindow = field(default_factory=lambda: FloatWindow(64))

    def answer(self, *latencies: float) -> None:
        """Results came back (as the tunnel client counts them)."""
        for ms in latencies:
            self.counters["results"] += 1
            self.latency_ms.append(ms)


class Clock:
    def __init__(self) -> None:
        self.wall, self.mono = 1_800_000_000.0, 100.0

    def tick(self, s: float = 10.0) -> tuple[float, float]:
        self.wall += s
        self.mono += s
        return self.wall, self.mono


def test_ten_thousand_samples_leave_exactly_360_points() -> None:
    sampler, clock, cam = HistorySampler(), Clock(), FakeStream()
    times = []
    for _ in range(10_000):
        cam.counters["decoded"] += 50
        at, mono = clock.tick()
        times.append(at)
        sampler.sample({"cam": cam}, at, mono)
    history = sampler.read()
    assert len(sampler) == 360 and history.points == 360
    assert history.timestamps == times[-360:]  # oldest first
    assert history.streams["cam"].fps_in == [5.0] * 360 == history.total.fps_in


def test_memory_does_not_grow_once_the_hour_is_full() -> None:
    sampler, clock = HistorySampler(), Clock()
    streams = {f"cam-{i}": FakeStream() for i in range(3)}

    def interval() -> None:
        for s in streams.values():
            s.counters["decoded"] += 10
            s.answer(40.0, 50.0)
        sampler.sample(streams, *clock.tick())

    for _ in range(400):  # the hour full, numpy's lazy imports done
        interval()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3_000):  # the ring wraps eight times
            interval()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown


def test_one_interval_fps_drops_and_only_its_latencies() -> None:
    sampler, clock, cam = HistorySampler(), Clock(), FakeStream()
    cam.answer(*[1000.0] * 30)  # before the first point: never in a later interval
    sampler.sample({"cam": cam}, *clock.tick())
    cam.counters["decoded"] += 80
    cam.counters["sampled_out"] += 40  # sampling by design: not a drop
    cam.counters["replaced"] += 3
    cam.counters["no_credit"] += 2
    cam.counters["decode_error"] += 1  # a failure, not counted as a drop
    cam.answer(*(float(v) for v in range(1, 101)))  # 100 results > the 64-value window
    cam.answer()
    sampler.sample({"cam": cam}, *clock.tick(20.0))
    series = sampler.read().streams["cam"]
    assert series.fps_in[-1] == 4.0 and series.fps_out[-1] == 5.0
    assert series.drops[-1] == 5.0
    assert series.latency_p50_ms[-1] == pytest.approx(68.5)  # the newest 64: 37..100
    assert series.latency_p99_ms[-1] == pytest.approx(99.37)
    sampler.sample({"cam": cam}, *clock.tick())  # nothing came: no latency, zero rates
    series = sampler.read().streams["cam"]
    assert series.latency_p50_ms[-1] is None and series.fps_out[-1] == 0.0
    assert series.drops[-1] == 0.0


def test_totals_merge_every_stream() -> None:
    sampler, clock = HistorySampler(), Clock()
    a, b = FakeStream(), FakeStream()
    a.answer(10.0, 10.0)
    b.answer(30.0, 30.0)
    a.counters["timeout"] = 4
    sampler.sample({"a": a, "b": b}, *clock.tick())
    total = sampler.read().total
    assert total.fps_out == [0.4] and total.drops == [4.0]
    assert total.latency_p50_ms == [20.0]


def test_deleted_streams_are_forgotten() -> None:
    sampler, clock = HistorySampler(), Clock()
    for i in range(2_000):  # a stream comes and goes every interval
        sampler.sample({f"cam-{i}": FakeStream(), "stays": FakeStream()}, *clock.tick())
        assert sampler.tracked == 2
    sampler.sample({}, *clock.tick())
    assert sampler.tracked == 0 and sampler.read().streams == {}


def test_a_replaced_stream_restarts_its_counts() -> None:
    sampler, clock, old = HistorySampler(), Clock(), FakeStream()
    old.counters["decoded"] = 1_000
    sampler.sample({"cam": old}, *clock.tick())
    new = FakeStream()  # PUT /v1/streams/cam: a new stream object, counters from zero
    new.counters["decoded"] = 20
    sampler.sample({"cam": new}, *clock.tick())
    assert sampler.read().streams["cam"].fps_in == [None, 2.0]


def test_a_new_stream_has_nulls_before_it_started() -> None:
    sampler, clock, a = HistorySampler(), Clock(), FakeStream()
    sampler.sample({"a": a}, *clock.tick())
    sampler.sample({"a": a, "b": FakeStream()}, *clock.tick())
    history = sampler.read()
    assert history.streams["b"].fps_in == [None, 0.0]
    assert sampler.read(["never"]).streams["never"].fps_in == [None, None]


def test_streams_over_the_cap_count_in_totals_only() -> None:
    sampler, clock = HistorySampler(max_streams=2), Clock()
    streams = {f"cam-{i}": FakeStream() for i in range(5)}
    for s in streams.values():
        s.counters["decoded"] = 10
    sampler.sample(streams, *clock.tick())
    history = sampler.read()
    assert sampler.tracked == 2 and len(history.streams) == 2
    assert history.total.fps_in == [5.0]


def test_values_are_finite_or_null() -> None:
    sampler, clock = HistorySampler(points=3), Clock()
    sampler.sample({"a": FakeStream()}, *clock.tick())
    for series in (sampler.read().total, sampler.read().streams["a"]):
        for values in series.model_dump().values():
            assert all(v is None or math.isfinite(v) for v in values)


@pytest.mark.parametrize(
    "kwargs", [{"points": 0}, {"interval_s": 0.0}, {"interval_s": math.nan}, {"max_streams": -1}]
)
def test_bad_sizes_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="history needs"):
        HistorySampler(**kwargs)  # type: ignore[arg-type]


async def test_run_samples_every_interval_until_stopped() -> None:
    sampler, stop = HistorySampler(interval_s=0.05), asyncio.Event()
    task = asyncio.create_task(sampler.run({"a": FakeStream()}, stop))
    await asyncio.sleep(0.4)
    stop.set()
    await asyncio.wait_for(task, 2)
    samples = len(sampler)
    assert 2 <= samples <= 8
