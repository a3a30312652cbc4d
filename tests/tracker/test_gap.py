"""Bridging an outage (tracker.gap, SortFamilyTracker.bridge): no sockets."""

from __future__ import annotations

import numpy as np
import pytest

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from tracker import create_tracker, restore_tracker
from tracker import gap as gap_mod
from tracker.engine import SortFamilyTracker
from tracker.gap import GapBridging
from tracker.tracks import LOST

FPS = 5.0


def _boxes(*xs: float, y: float = 100.0, w: float = 40.0, h: float = 120.0) -> Detections:
    xyxy = np.array([[x, y, x + w, y + h] for x in xs], np.float32)
    n = len(xs)
    return Detections(xyxy=xyxy, confidence=np.full(n, 0.9, np.float32),
                      class_id=np.zeros(n, np.int32))  # fmt: skip


def _walk(trk: SortFamilyTracker, starts: list[float], speed: float, t0: float, t1: float) -> None:
    """People at ``starts`` walking right at ``speed`` px/s, one frame per 1/FPS s."""
    for k in range(round((t1 - t0) * FPS) + 1):
        t = t0 + k / FPS
        trk.update(_boxes(*(x + speed * t for x in starts)), t)


def _ids_at(trk: SortFamilyTracker, starts: list[float], speed: float, t: float) -> list[int]:
    ids: list[int] = trk.update(_boxes(*(x + speed * t for x in starts)), t).tracker_id.tolist()
    return ids


def _tracker(**settings: float) -> SortFamilyTracker:
    trk = create_tracker("default", **settings)
    assert isinstance(trk, SortFamilyTracker)
    return trk


def test_ids_continue_over_a_5_s_outage_with_defaults() -> None:
    starts, speed = [20.0, 200.0, 380.0], 15.0
    trk = _tracker()
    _walk(trk, starts, speed, 0.0, 1.0)
    before = _ids_at(trk, starts, speed, 1.2)
    resumed = restore_tracker(trk.snapshot())
    assert isinstance(resumed, GapBridging) and resumed.bridge(6.2)
    assert _ids_at(resumed, starts, speed, 6.2) == before == [1, 2, 3]  # type: ignore[arg-type]


def test_without_the_bridge_the_same_outage_drops_every_track() -> None:
    starts, speed = [20.0, 200.0, 380.0], 15.0
    trk = _tracker()
    _walk(trk, starts, speed, 0.0, 1.0)
    _ids_at(trk, starts, speed, 1.2)
    trk.update(_boxes(*(x + speed * 6.2 for x in starts)), 6.2)  # ages them out: new tracks
    assert len(trk.tracks) == 3 and set(trk.tracks.track_id.tolist()) <= {0, 4, 5, 6}


def test_the_gap_does_not_count_as_lost_time_but_earlier_lost_time_does() -> None:
    trk = _tracker(max_lost_s=1.0)
    _walk(trk, [20.0, 300.0], 0.0, 0.0, 1.0)
    for k in range(1, 4):  # the second person unseen for 0.6 s before the snapshot
        trk.update(_boxes(20.0), 1.0 + k / FPS)
    lost_row = int(np.nonzero(trk.tracks.status == LOST)[0][0])
    lost_age = trk._t - float(trk.tracks.t_obs[lost_row])
    assert trk.bridge(1.6 + 5.0)
    assert trk._t - float(trk.tracks.t_obs[lost_row]) == pytest.approx(lost_age)
    trk.update(_boxes(20.0), 6.8)  # 0.8 s lost in all: still kept
    assert len(trk.tracks) == 2
    trk.update(_boxes(20.0), 7.2)  # 1.2 s: over max_lost_s, dropped
    assert trk.tracks.track_id.tolist() == [1]


def test_covariance_grows_for_the_real_gap() -> None:
    trk = _tracker()
    _walk(trk, [100.0], 10.0, 0.0, 1.0)
    var = trk.tracks.cov[:, 0].copy()
    short = restore_tracker(trk.snapshot())
    assert isinstance(short, SortFamilyTracker) and short.bridge(2.0)
    assert trk.bridge(6.0)
    assert np.all(trk.tracks.cov[:, 0] > short.tracks.cov[:, 0]) and np.all(
        short.tracks.cov[:, 0] > var
    )


def test_predicted_motion_moves_the_track_and_its_last_box() -> None:
    trk = _tracker()
    _walk(trk, [100.0], 20.0, 0.0, 2.0)
    obs = trk.tracks.obs.copy()
    cx = float(trk.tracks.mean[0, 0])
    assert trk.bridge(7.0)
    moved = float(trk.tracks.mean[0, 0]) - cx
    assert moved == pytest.approx(5.0 * float(trk.tracks.mean[0, 4]))
    assert 60.0 < moved < 140.0  # about 20 px/s for 5 s
    np.testing.assert_allclose(trk.tracks.obs[0, [0, 2]] - obs[0, [0, 2]], moved)


@pytest.mark.parametrize(
    ("gap", "bridged"), [(0.0, False), (-1.0, False), (5.0, True), (10.0, True), (10.5, False)]
)
def test_only_gaps_up_to_max_gap_s_are_bridged(gap: float, bridged: bool) -> None:
    trk = _tracker()
    _walk(trk, [100.0], 0.0, 0.0, 1.0)
    assert trk.bridge(1.0 + gap) is bridged


def test_a_person_far_from_the_prediction_gets_a_new_id() -> None:
    trk = _tracker()
    _walk(trk, [100.0], 0.0, 0.0, 1.0)
    assert trk.bridge(6.0)
    out = trk.update(_boxes(500.0), 6.0)
    assert out.tracker_id.tolist() != [1]


def test_bridge_refuses_a_non_finite_time_and_an_empty_tracker_does_nothing() -> None:
    trk = _tracker()
    with pytest.raises(ValueError, match="finite"):
        trk.bridge(float("nan"))
    assert not trk.bridge(5.0)  # nothing seen yet


def test_configure_changes_time_settings_and_keeps_tracks() -> None:
    trk = _tracker()
    _walk(trk, [100.0], 0.0, 0.0, 1.0)
    trk.configure(max_lost_s=4.0, max_gap_s=20.0)
    assert trk.settings.max_lost_s == 4.0 and len(trk.tracks) == 1
    with pytest.raises(ConfigError, match="max_gap_s"):
        trk.configure(max_gap_s=float("inf"))
    with pytest.raises(ConfigError, match="max_lost_s"):
        trk.configure(max_lost_s=-1.0)


def test_unambiguous_assignment_keeps_a_lone_pair_and_a_clear_winner() -> None:
    one = np.array([0], np.int64)
    r, c = gap_mod.unambiguous_assignment(one, one, np.array([0.5]))
    assert r.tolist() == [0] and c.tolist() == [0]  # no rival: kept however weak
    rows, cols = np.array([0, 0], np.int64), np.array([0, 1], np.int64)
    r, c = gap_mod.unambiguous_assignment(rows, cols, np.array([12.0, 2.0]))
    assert r.tolist() == [0] and c.tolist() == [0]  # the rival is far worse


def test_unambiguous_assignment_drops_pairs_a_rival_explains_as_well() -> None:
    rows, cols = np.array([0, 0, 1, 1], np.int64), np.array([0, 1, 0, 1], np.int64)
    r, _ = gap_mod.unambiguous_assignment(rows, cols, np.array([10.0, 9.9, 9.9, 10.0]))
    assert r.size == 0  # swapping the two costs almost nothing: ambiguous
    rows, cols = np.array([0, 0], np.int64), np.array([0, 1], np.int64)
    r, _ = gap_mod.unambiguous_assignment(rows, cols, np.array([8.0, 7.5]))
    assert r.size == 0  # one track between two detections


def test_an_ambiguous_pair_after_a_gap_continues_no_track_a_lone_person_does() -> None:
    trk = _tracker()
    _walk(trk, [100.0, 600.0], 0.0, 0.0, 1.0)
    before = _ids_at(trk, [100.0, 600.0], 0.0, 1.2)
    assert trk.bridge(6.2)
    # the first person's place now holds two people, one each side of it
    ids = trk.update(_boxes(80.0, 120.0, 600.0), 6.2).tracker_id.tolist()
    assert before[0] not in ids  # neither of the pair continues the first track
    assert ids[2] == before[1]  # the lone person keeps their id
