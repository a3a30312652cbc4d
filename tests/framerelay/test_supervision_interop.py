"""``Detections`` <-> ``supervision.Detections``: both ways, and framerelay never imports
supervision unless asked."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from framerelay.detections import UNTRACKED, Detections
from tests.conftest import ROOT

sv = pytest.importorskip("supervision")


def _ours(tracked: bool = True) -> Detections:
    return Detections(
        xyxy=np.array([[1.5, 2.0, 30.0, 40.25], [100, 110, 150, 190]], np.float32),
        confidence=np.array([0.9, 0.35], np.float32),
        class_id=np.array([0, 2], np.int32),
        tracker_id=np.array([7, UNTRACKED] if tracked else [UNTRACKED, UNTRACKED], np.int64),
    )


def test_round_trip_keeps_boxes_scores_classes_and_track_ids() -> None:
    ours = _ours()
    theirs = ours.to_supervision()
    assert isinstance(theirs, sv.Detections) and len(theirs) == 2
    np.testing.assert_array_equal(theirs.xyxy, ours.xyxy)
    np.testing.assert_array_equal(theirs.class_id, [0, 2])
    np.testing.assert_array_equal(theirs.tracker_id, [7, UNTRACKED])
    back = Detections.from_supervision(theirs)
    assert back.equals(ours)
    assert back.xyxy.dtype == np.float32 and back.tracker_id.dtype == np.int64


def test_untracked_means_no_tracker_ids_and_supervision_tools_work_on_it() -> None:
    theirs = _ours(tracked=False).to_supervision()
    assert theirs.tracker_id is None
    assert Detections.from_supervision(theirs).equals(_ours(tracked=False))
    kept = theirs[np.array([True, False])]  # supervision's own selection
    assert isinstance(kept, sv.Detections)
    assert Detections.from_supervision(kept).equals(_ours(tracked=False)[np.array([0])])
    area = theirs.box_area
    assert area[0] == pytest.approx((30.0 - 1.5) * (40.25 - 2.0))


def test_empty_and_annotation_like_inputs() -> None:
    empty = Detections.empty().to_supervision()
    assert len(empty) == 0
    assert len(Detections.from_supervision(sv.Detections.empty())) == 0
    assert len(Detections.from_supervision(empty)) == 0
    annotations = sv.Detections(xyxy=np.array([[0, 0, 10, 10]], float), class_id=np.array([3]))
    ours = Detections.from_supervision(annotations)
    assert ours.confidence.tolist() == [1.0] and ours.tracker_id.tolist() == [UNTRACKED]
    with pytest.raises(ValueError, match="needs class_id"):
        Detections.from_supervision(sv.Detections(xyxy=np.array([[0, 0, 10, 10]], float)))


def test_framerelay_does_not_import_supervision_until_asked() -> None:
    code = (
        "import sys, framerelay.detections, framerelay.results, framerelay.cli; "
        "print('supervision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"
