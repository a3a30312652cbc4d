"""Budgets that damaged input cannot escape: epochs per minute, frames per second,
finite time settings, and a stream that fails at start.

A byte-flipped MP4 (flipped composition offsets) once started ~7-11 epochs a
second and sent over 3x the stream's fps: the sampler restarted its schedule at
every epoch. Now epochs are budgeted (``max_epochs_per_min``), the storm beyond
it is ``corrupt_timestamps`` sampled in decode order, and kept frames are at
most ``fps`` on a clock damage cannot speed up.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from framerelay.timeline import EpochBudget, FrameClock, Sampler, Timeline
from ingest import stream as stream_module
from ingest.settings import StreamConfig
from ingest.stream import Outgoing, StreamState
from tests.support.harness import run_to_end, standalone
from tests.support.media import ffmpeg
from tests.support.waiting import wait_until_async

TB = Fraction(1, 12_800)
FPS = 5.0
SOURCE_FPS = 25


@pytest.fixture(scope="module")
def flipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """10 s at 25 fps, H.264 with B-frames, 10 random bytes of its ``ctts`` box flipped."""
    root = tmp_path_factory.mktemp("flipped")
    clean = root / "clean.mp4"
    ffmpeg("-f", "lavfi", "-i", f"testsrc2=size=320x240:rate={SOURCE_FPS}", "-t", "10",
           "-c:v", "libx264", "-preset", "ultrafast", "-g", "25", "-bf", "2",
           "-pix_fmt", "yuv420p", str(clean))  # fmt: skip
    data = bytearray(clean.read_bytes())
    at = data.find(b"ctts")
    size = int.from_bytes(data[at - 4 : at], "big")
    rnd = random.Random(7)
    for _ in range(10):
        data[rnd.randrange(at + 12, at - 4 + size)] ^= 0xFF
    out = root / "flipped.mp4"
    out.write_bytes(bytes(data))
    yield out


def _monotonic_within_epochs(got: list[Outgoing]) -> bool:
    for _, group in itertools.groupby(got, key=lambda o: o.timing.epoch):
        pts = [o.timing.pts for o in group]
        if pts != sorted(pts):
            return False
    return True


def _max_in_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    return max(
        (sum(1 for u in times[i:] if u - t <= window_s) for i, t in enumerate(times)), default=0
    )


# -- units --------------------------------------------------------------------


def test_epoch_budget_counts_a_sliding_window() -> None:
    b = EpochBudget(3, window_s=60)
    assert [b.spend(t) for t in (0, 1, 2, 3, 4)] == [True, True, True, False, False]
    assert b.count(4) == 5 and not b.calm(4)
    assert b.count(61.5) == 3 and not b.spend(61.5)  # 0 and 1 left the window
    assert b.count(63.5) == 2 and b.spend(63.5)  # 2 and 3 too: 4 and 61.5 remain
    assert b.count(200) == 0 and b.calm(200)
    with pytest.raises(ValueError, match="finite"):
        EpochBudget(3, window_s=math.inf)


def test_timestamp_storm_is_budgeted_then_stamped_in_decode_order() -> None:
    budget = EpochBudget(5, window_s=60)
    tl = Timeline(TB, budget=budget, step=512)
    rnd = random.Random(1)
    raw = [i * 512 + (rnd.randrange(-20, 20) * 512 if i % 3 == 0 else 0) for i in range(300)]
    stamps = [tl.stamp(p, now=i / SOURCE_FPS) for i, p in enumerate(raw)]
    assert tl.epoch == 5 and tl.decode_order
    assert tl.corrupt > 50
    last_epoch = [p for e, p in stamps if e == tl.epoch]
    assert last_epoch == sorted(last_epoch)
    assert {b - a for a, b in itertools.pairwise(last_epoch[-50:])} == {512}  # decode order


def test_timestamps_are_trusted_again_once_the_storm_is_over() -> None:
    tl = Timeline(TB, budget=EpochBudget(4, window_s=60), step=512)
    for i in range(20):  # every frame goes backwards
        tl.stamp(1000 - i, now=float(i))
    assert tl.decode_order and tl.epoch == 4
    epoch, pts = tl.stamp(5000, now=30.0)  # still 16 in the window: decode order
    assert tl.decode_order and epoch == 4
    epoch, pts = tl.stamp(5512, now=78.0)  # 2 left in the window: PTS again, a new epoch
    assert not tl.decode_order and (epoch, pts) == (5, 5512)
    assert tl.stamp(6024, now=78.04) == (5, 6024)


def test_without_budget_every_discontinuity_is_an_epoch() -> None:
    tl = Timeline(TB)
    assert [tl.stamp(p)[0] for p in (0, 512, 0, 512, 0)] == [0, 0, 1, 1, 2]
    assert tl.corrupt == 0


def test_wall_clock_bucket_caps_any_window() -> None:
    # Frames arrive at 100 per second with random (damaged) times and epochs.
    s = Sampler(FPS)
    rnd = random.Random(3)
    kept = [
        i / 100 for i in range(2000) if s.keep(rnd.randrange(50), rnd.uniform(0, 100), now=i / 100)
    ]
    for window in (0.5, 1.0, 5.0):
        assert _max_in_window(kept, window) <= 1 + window * FPS
    print(f"\nbucket: {len(kept)} kept in 20 s at fps {FPS}")


def test_bucket_refusal_keeps_the_schedule() -> None:
    # The wall clock says too soon by 1 ms at the due frame: the next frame is kept.
    s = Sampler(FPS)
    assert s.keep(0, 0.0, now=0.0)
    assert not s.keep(0, 0.2, now=0.19)
    assert s.keep(0, 0.24, now=0.23)
    assert s.keep(0, 0.4, now=0.43)  # back on the PTS schedule


@pytest.mark.parametrize(
    ("steps", "expect"),
    [
        ([0.04] * 20, 0.04),
        ([0.1] * 20, 0.1),  # a wrong nominal rate (25) is corrected by the PTS
        ([0.04, 0.08, 0.04, 5.0, -3.0, 0.04, 0.12, 0.04] * 4, 0.04),  # damage cannot speed it
    ],
)
def test_frame_clock_follows_the_typical_step(steps: list[float], expect: float) -> None:
    clock = FrameClock(step_s=0.04)
    t = 0.0
    for step in steps:
        t += step
        clock.tick(0, t)
    before = clock.now
    clock.tick(0, t + expect)
    assert clock.now - before == pytest.approx(expect)


# -- a real byte-flipped file -----------------------------------------------------


async def test_byte_flipped_mp4_keeps_its_epoch_budget_and_rate(flipped: Path) -> None:
    unbudgeted, got_u = await run_to_end(
        StreamConfig(id="flip-free", url=str(flipped), fps=FPS, max_epochs_per_min=3600)
    )
    stream, got = await run_to_end(StreamConfig(id="flip", url=str(flipped), fps=FPS))
    decoded = stream.counters["decoded"]
    duration_s = decoded / SOURCE_FPS
    storm = unbudgeted.epoch
    print(
        f"\nbyte-flipped MP4, {decoded} frames = {duration_s:.1f} s at {SOURCE_FPS} fps, fps {FPS}:"
        f"\n  no budget: {storm} epochs ({storm / duration_s:.1f}/s), sent {len(got_u)} "
        f"= {len(got_u) / duration_s:.2f}/s"
        f"\n  default (30/min): {stream.epoch} epochs, corrupt_timestamps "
        f"{stream.counters['corrupt_timestamps']}, sent {len(got)} = "
        f"{len(got) / duration_s:.2f}/s; error: {stream.error}"
    )
    assert storm > 40, "the fixture must make a storm"
    assert stream.state is StreamState.STOPPED
    assert stream.epoch <= 30 and {o.timing.epoch for o in got} <= set(range(31))
    assert stream.counters["corrupt_timestamps"] >= storm - 30
    assert stream.error is not None and stream.error == stream.last_error
    assert stream.error.startswith("corrupt_timestamps: ")
    assert stream.error.endswith("discontinuities in 60 s; sampling in decode order")
    for s, sent in ((stream, got), (unbudgeted, got_u)):  # the rate bound holds either way
        assert len(sent) <= 1 + duration_s * FPS, s.id
        assert _monotonic_within_epochs(sent), s.id


async def test_byte_flipped_mp4_in_real_time_is_capped_by_the_wall_clock(flipped: Path) -> None:
    cfg = StreamConfig(id="flip-rt", url=str(flipped), fps=FPS, realtime=True, max_frames=75)
    stream, got = await run_to_end(cfg)
    times = [o.timing.captured_at for o in got]
    span = max(times) - min(times)
    worst = _max_in_window(times, 1.0)
    print(
        f"\nreal time: {stream.counters['decoded']} frames, {stream.epoch} epochs, sent "
        f"{len(got)} over {span:.1f} s, at most {worst} in any 1 s (fps {FPS})"
    )
    assert worst <= 1 + FPS
    assert _monotonic_within_epochs(got)


async def test_a_clean_file_is_sampled_at_fps_in_one_epoch(flipped: Path) -> None:
    stream, got = await run_to_end(
        StreamConfig(id="clean", url=str(flipped.with_name("clean.mp4")), fps=FPS)
    )
    assert stream.epoch == 0 and stream.error is None
    assert len(got) == 50 and stream.counters["corrupt_timestamps"] == 0


# -- settings -------------------------------------------------------------------

FLOAT_FIELDS = [
    name for name, f in StreamConfig.model_fields.items() if f.annotation in (float, float | None)
]


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "Infinity", "NaN", 1e308])
def test_every_time_setting_is_finite(name: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        StreamConfig.model_validate({"id": "s", "url": "x.mp4", name: value})
    text = str(info.value)
    assert name in text
    assert "finite number" in text or "less than or equal" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Infinity", "Input should be a finite number"),
        ("NaN", "Input should be a finite number"),
        (1e308, "Input should be less than or equal to 86400"),
    ],
)
def test_healthy_after_s_infinity_is_refused(value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        StreamConfig.model_validate({"id": "s", "url": "x.mp4", "healthy_after_s": value})
    assert "healthy_after_s" in str(info.value)


def test_time_fields_are_all_covered() -> None:
    assert {"healthy_after_s", "auth_retry_s", "open_timeout_s", "fps"} <= set(FLOAT_FIELDS)


# -- failing at start -------------------------------------------------------------


async def test_a_stream_that_fails_at_start_is_failed_with_a_message(
    monkeypatch: pytest.MonkeyPatch, flipped: Path
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no decoder today")

    good = StreamConfig(id="good", url=str(flipped.with_name("clean.mp4")), fps=FPS)
    missing = StreamConfig(id="missing", url=str(flipped.with_name("nope.mp4")))
    async with standalone(good) as (ok, _), standalone(missing) as (gone, _):
        with monkeypatch.context() as m:
            m.setattr(stream_module, "AVSource", broken)
            async with standalone(StreamConfig(id="bug", url=str(flipped))) as (bug, _):
                await wait_until_async(lambda: not bug.alive, 10, "the broken stream to end")
        await wait_until_async(lambda: ok.finished and not gone.alive, 30, "the others to end")
    assert bug.state is StreamState.FAILED and bug.error == "RuntimeError: no decoder today"
    assert gone.state is StreamState.FAILED
    assert gone.error is not None and "cannot open" in gone.error
    assert ok.state is StreamState.STOPPED and ok.error is None and ok.counters["decoded"] == 250
