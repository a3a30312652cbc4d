"""PTS unwrapping, epochs and sampling by PTS."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from framerelay.timeline import MPEGTS_WRAP_BITS, Sampler, Timeline

TB90K = Fraction(1, 90_000)
WRAP = 1 << MPEGTS_WRAP_BITS


def test_mpegts_wrap_is_unwrapped_without_new_epoch() -> None:
    tl = Timeline(TB90K, wrap_bits=MPEGTS_WRAP_BITS)
    start = WRAP - 90_000  # one second before the wrap
    stamps = [tl.stamp((start + i * 3600) % WRAP) for i in range(60)]
    assert {e for e, _ in stamps} == {0}
    pts = [p for _, p in stamps]
    assert all(b - a == 3600 for a, b in itertools.pairwise(pts))
    assert pts[-1] > WRAP


@pytest.mark.parametrize(
    ("raw", "epochs"),
    [
        ([0, 3600, 7200, 10800], [0, 0, 0, 0]),
        ([0, 3600, 0, 3600], [0, 0, 1, 1]),  # reset backwards
        ([0, 3600, 3600 + 90_000 * 11, 3600 + 90_000 * 11 + 3600], [0, 0, 1, 1]),  # jump > 10 s
        ([0, 3600, 3600 + 90_000 * 9], [0, 0, 0]),  # jump < 10 s: a gap, same epoch
        ([0, 3600, 3600], [0, 0, 0]),  # duplicate PTS is not a discontinuity
    ],
)
def test_discontinuities_start_epochs(raw: list[int], epochs: list[int]) -> None:
    tl = Timeline(TB90K)
    assert [tl.stamp(p)[0] for p in raw] == epochs


def test_new_epoch_applies_to_next_frame_only_once() -> None:
    tl = Timeline(TB90K)
    tl.stamp(100)
    tl.new_epoch()
    tl.new_epoch()
    assert tl.stamp(5) == (1, 5)
    assert tl.stamp(3605) == (1, 3605)


def test_new_epoch_before_any_frame_keeps_epoch_zero() -> None:
    tl = Timeline(TB90K)
    tl.new_epoch()
    assert tl.stamp(0) == (0, 0)


@pytest.mark.parametrize(
    ("fps", "src_fps", "n", "kept"),
    [
        (0, 25, 100, 100),
        (5, 25, 250, 50),
        (25, 25, 100, 100),
        (10, 30, 300, 100),
        (50, 25, 100, 100),
    ],
)
def test_sampler_keeps_target_rate_by_pts(fps: float, src_fps: float, n: int, kept: int) -> None:
    s = Sampler(fps)
    assert sum(s.keep(0, i / src_fps) for i in range(n)) == kept


def test_sampler_handles_vfr_and_gaps_without_bursts() -> None:
    s = Sampler(5)
    times = [0.0, 0.01, 0.19, 0.2, 0.21, 5.0, 5.05, 5.1, 5.2]
    kept = [t for t in times if s.keep(0, t)]
    assert kept == [0.0, 0.2, 5.0, 5.2]


def test_sampler_continues_its_schedule_across_epochs() -> None:
    # A new epoch's time follows one frame (step_s) after the last frame seen: the
    # schedule goes on instead of restarting, so a storm of epochs cannot burst.
    s = Sampler(5, step_s=0.04)
    assert s.keep(0, 10.0)
    assert not s.keep(1, 0.0)  # 10.04 on the continuous time: not due before 10.2
    assert not s.keep(1, 0.12)  # 10.16
    assert s.keep(1, 0.16)  # 10.20
    assert sum(s.keep(e, 0.0) for e in range(2, 100)) <= 98 * 0.04 * 5 + 1
