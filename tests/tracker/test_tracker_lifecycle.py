"""Id lifecycle and association stages of the SORT-family trackers, end to end."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from tracker import Tracker, available_trackers, create_tracker
from tracker.tracks import LOST, TRACKED

NAMES = ["default", "hybrid", "bytetrack", "ocsort"]


def dets(
    boxes: Sequence[Sequence[float]], conf: float | Sequence[float] = 0.9, cls: int = 0
) -> Detections:
    n = len(boxes)
    return Detections(
        xyxy=np.array(boxes, np.float32).reshape(n, 4),
        confidence=np.broadcast_to(np.asarray(conf, np.float32), (n,)).copy(),
        class_id=np.full(n, cls, np.int32),
    )


def box(cx: float, cy: float = 200.0, w: float = 40.0, h: float = 100.0) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def walk(trk: Tracker, times: Sequence[float], speed: float = 50.0, x0: float = 100.0) -> list[int]:
    """One object moving right at ``speed`` px/s, seen at ``times``; its ids."""
    return [int(trk.update(dets([box(x0 + speed * t)]), t).tracker_id[0]) for t in times]


@pytest.mark.parametrize("name", NAMES)
def test_ids_start_at_one_and_are_per_instance(name: str) -> None:
    a, b = create_tracker(name), create_tracker(name)
    two = dets([box(100), box(300)])
    assert a.update(two, 0.0).tracker_id.tolist() == [1, 2]
    assert b.update(dets([box(500)]), 0.0).tracker_id.tolist() == [1]  # no shared counter
    assert a.update(two, 0.04).tracker_id.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("confirm_first", "min_hits", "want"),
    [
        (True, 2, [1, 1, 1]),
        (False, 2, [-1, 1, 1]),
        (False, 3, [-1, -1, 1]),
        (False, 1, [1, 1, 1]),
    ],
)
def test_confirmation_needs_min_hits(confirm_first: bool, min_hits: int, want: list[int]) -> None:
    trk = create_tracker("default", confirm_first_update=confirm_first, min_hits=min_hits)
    assert walk(trk, [0.0, 0.04, 0.08]) == want


def test_later_births_are_tentative_first() -> None:
    trk = create_tracker("default")
    trk.update(dets([box(100)]), 0.0)
    assert trk.update(dets([box(102), box(400)]), 0.04).tracker_id.tolist() == [1, -1]
    assert trk.update(dets([box(104), box(400)]), 0.08).tracker_id.tolist() == [1, 2]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("fps", "gap_s", "max_lost_s", "same"),
    [
        (25, 0.4, 1.0, True),
        (25, 1.6, 1.0, False),
        (5, 0.6, 1.0, True),
        (5, 1.6, 1.0, False),
        (25, 1.6, 2.0, True),
    ],
)
def test_lost_threshold_is_in_seconds(
    name: str, fps: int, gap_s: float, max_lost_s: float, same: bool
) -> None:
    trk = create_tracker(name, max_lost_s=max_lost_s)
    before = np.arange(0.0, 1.0, 1 / fps)
    after = np.arange(before[-1] + gap_s, before[-1] + gap_s + 0.5, 1 / fps)
    ids = walk(trk, before.tolist()) + walk(trk, after.tolist())
    first = ids[0]
    assert set(ids[: len(before)]) == {first}
    back = [i for i in ids[len(before) :] if i != -1]
    assert back, "the object must be tracked again"
    assert bool(back[0] == first) is same


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pattern", ["drops", "vfr", "every5"])
def test_dropped_frames_vfr_and_sampling_keep_ids(name: str, pattern: str) -> None:
    rng = np.random.default_rng(7)
    t = np.arange(0, 4, 1 / 25)
    if pattern == "drops":
        t = t[rng.random(t.size) > 0.4]
    elif pattern == "vfr":
        t = np.cumsum(rng.uniform(0.01, 0.15, 60))
    else:
        t = t[::5]
    trk = create_tracker(name)
    ids = set()
    for ti in t:
        out = trk.update(dets([box(100 + 80 * ti), box(600 - 60 * ti, 300)]), float(ti))
        ids.update(out.tracker_id.tolist())
    assert ids == {1, 2}


@pytest.mark.parametrize(
    ("name", "options", "out_id", "status"),
    [
        ("bytetrack", {}, 1, TRACKED),  # stage 2 matches it and reports it
        ("hybrid", {}, -1, TRACKED),  # matched (track stays alive), not reported
        ("hybrid", {"report_threshold": 0.15}, 1, TRACKED),
        ("hybrid", {"use_low_stage": False}, -1, LOST),
        ("ocsort", {}, -1, LOST),  # OC-SORT has no low stage
    ],
)
def test_low_confidence_detection_continues_a_track(
    name: str, options: dict[str, object], out_id: int, status: int
) -> None:
    trk = create_tracker(name, **options)
    for k in range(5):
        trk.update(dets([box(100 + 2 * k)], 0.9), k * 0.04)
    out = trk.update(dets([box(110)], 0.2), 5 * 0.04)
    assert out.tracker_id.tolist() == [out_id]
    assert trk.tracks.status.tolist() == [status]  # type: ignore[attr-defined]
    assert trk.update(dets([box(112)], 0.9), 6 * 0.04).tracker_id.tolist() == [1]


@pytest.mark.parametrize(
    ("name", "options", "status"),
    [
        ("default", {}, TRACKED),  # stage 2 offers the low box to the lost track
        ("default", {"low_stage_lost": False}, LOST),
        ("bytetrack", {}, LOST),  # the paper's stage 2: tracked tracks only
    ],
)
def test_low_confidence_detection_brings_a_lost_track_back(
    name: str, options: dict[str, object], status: int
) -> None:
    trk = create_tracker(name, **options)
    for k in range(5):
        trk.update(dets([box(100 + 2 * k)], 0.9), k * 0.04)
    trk.update(dets([box(600)], 0.9), 5 * 0.04)  # not there: lost
    assert trk.tracks.status[0] == LOST  # type: ignore[attr-defined]
    trk.update(dets([box(600), box(112)], [0.9, 0.2]), 6 * 0.04)
    assert trk.tracks.status[0] == status  # type: ignore[attr-defined]


@pytest.mark.parametrize(("low_noise", "moves_less"), [(3.0, True), (1.0, False)])
def test_low_confidence_box_moves_the_track_less(low_noise: float, moves_less: bool) -> None:
    """A low box (often partial or merged) corrects the filter less than a high one."""
    shifts = []
    for conf in (0.9, 0.2):
        trk = create_tracker("default", low_noise=low_noise)
        for k in range(5):
            trk.update(dets([box(100)], 0.9), k * 0.04)
        trk.update(dets([box(108)], conf), 5 * 0.04)
        shifts.append(float(trk.tracks.mean[0, 0]) - 100.0)  # type: ignore[attr-defined]
    assert shifts[0] > 0 and shifts[1] > 0
    assert (shifts[1] < 0.5 * shifts[0]) is moves_less
    if not moves_less:
        assert shifts[1] == pytest.approx(shifts[0])


@pytest.mark.parametrize("name", NAMES)
def test_low_confidence_never_starts_a_track(name: str) -> None:
    trk = create_tracker(name)
    for k in range(10):
        assert trk.update(dets([box(100)], 0.3), k * 0.04).tracker_id.tolist() == [-1]


@pytest.mark.parametrize(
    ("name", "same"), [("hybrid", True), ("ocsort", True), ("bytetrack", False)]
)
def test_recovery_by_last_observation(name: str, same: bool) -> None:
    """Fast object stops while unseen: the prediction runs away, but OC-SORT's
    recovery matches the detection to the track's last observed box."""
    trk = create_tracker(name)
    times = np.arange(0, 0.6, 0.04)
    ids = walk(trk, times.tolist(), speed=300.0)
    stop_x = 100 + 300 * times[-1]
    later = [trk.update(dets([box(stop_x)]), t).tracker_id[0] for t in (1.0, 1.04, 1.08)]
    assert ids[-1] == 1
    assert bool(later[-1] == 1) is same


@pytest.mark.parametrize(
    ("settings", "same"),
    [
        ({}, True),  # unseen 0.44 s: both boxes grown by 0.35 of their size, IoU 0.58
        ({"recovery_speed": 0.0}, False),  # no buffer: IoU 0.38 < recovery_iou 0.5
        ({"recovery_max_buffer": 0.1}, False),  # grown by 0.1 only: IoU 0.45
    ],
)
def test_recovery_buffer_grows_with_the_time_unseen(settings: dict[str, float], same: bool) -> None:
    """The last observed box goes stale while the object moves on unseen: stage 3
    grows it and the detections by recovery_speed x the time since (capped)."""
    trk = create_tracker("default", **settings)
    times = np.arange(0, 0.6, 0.04)
    walk(trk, times.tolist(), speed=300.0)  # the prediction runs away once unseen
    last_x = 100 + 300 * times[-1]
    back = trk.update(dets([box(last_x + 18)]), times[-1] + 0.44).tracker_id[0]
    assert bool(back == 1) is same


@pytest.mark.parametrize(("class_aware", "same"), [(True, False), (False, True)])
def test_class_aware_matching(class_aware: bool, same: bool) -> None:
    trk = create_tracker("default", class_aware=class_aware)
    for k in range(3):
        trk.update(dets([box(100)], cls=0), k * 0.04)
    out = [trk.update(dets([box(100)], cls=2), 0.12 + k * 0.04).tracker_id[0] for k in range(3)]
    assert bool(out[-1] == 1) is same


@pytest.mark.parametrize("name", [*NAMES, "none"])
def test_output_keeps_rows_and_order(name: str) -> None:
    trk = create_tracker(name)
    rng = np.random.default_rng(1)
    for k in range(20):
        xy = rng.uniform(0, 500, (6, 2))
        d = Detections(
            np.hstack([xy, xy + 50]).astype(np.float32),
            rng.uniform(0, 1, 6).astype(np.float32),
            rng.integers(0, 3, 6).astype(np.int32),
        )
        out = trk.update(d, k * 0.04)
        assert np.array_equal(out.xyxy, d.xyxy)
        assert np.array_equal(out.confidence, d.confidence)
        assert np.array_equal(out.class_id, d.class_id)
        assert out.tracker_id.shape == (6,)


@pytest.mark.parametrize("name", NAMES)
def test_empty_frames(name: str) -> None:
    """Only the very first update confirms at once; a tentative track missed
    once (with ``tentative_max_gap_s`` 0) is dropped, and ids are handed out only
    on confirmation."""
    trk = create_tracker(name, tentative_max_gap_s=0.0)
    assert len(trk.update(Detections.empty(), 0.0)) == 0
    assert trk.update(dets([box(100)]), 0.04).tracker_id.tolist() == [-1]
    assert len(trk.update(Detections.empty(), 0.08)) == 0
    assert trk.update(dets([box(100)]), 0.12).tracker_id.tolist() == [-1]
    assert trk.update(dets([box(100)]), 0.16).tracker_id.tolist() == [1]


@pytest.mark.parametrize(
    ("name", "misses", "want"),
    [
        ("default", 3, [-1, 2]),  # missed for 0.12 s <= tentative_max_gap_s 0.2
        ("default", 6, [-1, -1]),  # missed for 0.24 s: dropped, starts again
        ("bytetrack", 1, [-1, -1]),  # dropped at its first miss
    ],
)
def test_tentative_track_survives_a_short_miss(name: str, misses: int, want: list[int]) -> None:
    trk = create_tracker(name)
    trk.update(dets([box(900)]), 0.0)  # the first update confirms at once (id 1)
    ids = [int(trk.update(dets([box(900), box(100)]), 0.04).tracker_id[1])]
    for k in range(misses):  # 25 fps, the newcomer not seen
        trk.update(dets([box(900)]), 0.08 + 0.04 * k)
    ids.append(int(trk.update(dets([box(900), box(100)]), 0.08 + 0.04 * misses).tracker_id[1]))
    assert ids == want


def test_time_going_backwards_is_treated_as_latest() -> None:
    trk = create_tracker("default")
    walk(trk, [0.0, 0.04, 0.08])
    assert walk(trk, [0.02]) == [1]  # no predict backwards, still the same object


@pytest.mark.parametrize("t", [float("nan"), float("inf")])
def test_non_finite_time_is_rejected(t: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        create_tracker("default").update(dets([box(100)]), t)


@pytest.mark.parametrize("name", NAMES)
def test_reset_restarts_ids(name: str) -> None:
    trk = create_tracker(name)
    walk(trk, [0.0, 0.04])
    trk.update(dets([box(100), box(400)]), 0.08)
    trk.update(dets([box(100), box(400)]), 0.12)
    trk.reset()
    assert walk(trk, [5.0]) == [1]


@pytest.mark.parametrize(
    "settings",
    [
        {"bogus": 1},
        {"max_lost_s": -1},
        {"high_threshold": 0.3, "low_threshold": 0.5},
        {"min_hits": 0},
        {"match_iou": 2.0},
    ],
)
def test_invalid_settings_raise_config_error(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="invalid settings"):
        create_tracker("default", **settings)


def test_registry() -> None:
    assert {"default", "hybrid", "bytetrack", "ocsort", "none"} <= set(available_trackers())
    assert create_tracker().name == "hybrid"
    with pytest.raises(ConfigError, match="unknown tracker"):
        create_tracker("nope")


def _newcomer(trk: Tracker, step: float, shift: float) -> list[int]:
    """After a first update elsewhere, an object appears and moves ``shift`` px
    (0.75 of its width) per update every ``step`` seconds; its ids."""
    trk.update(dets([box(900)]), 0.0)
    return [
        int(trk.update(dets([box(900), box(100 + shift * k)]), step * (k + 1)).tracker_id[1])
        for k in range(4)
    ]


@pytest.mark.parametrize(
    ("step", "speed", "confirmed"),
    [
        (0.5, 2.0, True),  # 2 fps: boxes grown by 1 size, IoU 0.6
        (0.5, 0.0, False),  # no buffer: IoU 0.14 < tentative_match_iou
        (0.04, 2.0, False),  # same pixels per frame at 25 fps is 750 px/s: buffer 0.08
    ],
)
def test_tentative_search_scales_with_the_time_step(
    step: float, speed: float, confirmed: bool
) -> None:
    trk = create_tracker("default", tentative_speed=speed)
    ids = _newcomer(trk, step, shift=30.0)
    assert ids[0] == -1  # tentative at first sight
    assert all(i > 0 for i in ids[1:]) if confirmed else ids[1:] == [-1, -1, -1]


@pytest.mark.parametrize(("name", "speed"), [("default", 2.0), ("bytetrack", 0.0), ("ocsort", 0.0)])
def test_tentative_speed_defaults(name: str, speed: float) -> None:
    assert create_tracker(name).settings.tentative_speed == speed  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "speed"), [("default", 2.0), ("bytetrack", 0.0), ("ocsort", 0.0)])
def test_recovery_speed_defaults(name: str, speed: float) -> None:
    assert create_tracker(name).settings.recovery_speed == speed  # type: ignore[attr-defined]
