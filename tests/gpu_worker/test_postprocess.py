"""Output decoding and NMS, numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from framerelay.geometry import Letterbox
from gpu_worker.detectors.postprocess import (
    PostprocessSettings,
    decode_ultralytics,
    decode_yolox,
    nms,
    select,
    yolox_grid,
)


@pytest.mark.parametrize(
    ("boxes", "scores", "iou", "kept"),
    [
        ([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], [0.9, 0.8, 0.7], 0.45, [0, 2]),
        ([[0, 0, 10, 10], [1, 1, 11, 11]], [0.5, 0.9], 0.45, [1]),
        ([[0, 0, 10, 10], [5, 0, 15, 10]], [0.9, 0.8], 0.45, [0, 1]),  # IoU 1/3 stays
        ([[0, 0, 10, 10], [5, 0, 15, 10]], [0.9, 0.8], 0.3, [0]),
        ([[0, 0, 0, 0], [0, 0, 0, 0]], [0.9, 0.8], 0.45, [0, 1]),  # degenerate boxes
        ([], [], 0.45, []),
    ],
)
def test_nms(boxes: list[list[float]], scores: list[float], iou: float, kept: list[int]) -> None:
    xyxy = np.asarray(boxes, np.float32).reshape(-1, 4)
    assert nms(xyxy, np.asarray(scores, np.float32), iou).tolist() == kept


def test_yolox_grid_matches_export_layout() -> None:
    grid = yolox_grid(416, 416)
    assert grid.shape == (52 * 52 + 26 * 26 + 13 * 13, 3)
    assert grid[0].tolist() == [0, 0, 8]
    assert grid[1].tolist() == [1, 0, 8]
    assert grid[52].tolist() == [0, 1, 8]
    assert grid[52 * 52].tolist() == [0, 0, 16]


def test_decode_yolox_row() -> None:
    grid = yolox_grid(416, 416)
    raw = np.zeros((grid.shape[0], 85), np.float32)
    i = 52 * 3 + 5  # grid (5, 3) at stride 8
    raw[i, :4] = [0.5, 0.5, np.log(4.0), np.log(2.0)]  # centre (44, 28), 32 x 16 px
    raw[i, 4] = 0.9
    raw[i, 5 + 2] = 0.8
    xyxy, score, cls = decode_yolox(raw, grid)
    assert xyxy[i].tolist() == pytest.approx([28, 20, 60, 36])
    assert score[i] == pytest.approx(0.72)
    assert cls[i] == 2


def test_decode_ultralytics_layout() -> None:
    raw = np.zeros((84, 10), np.float32)
    raw[:4, 3] = [100, 50, 20, 10]
    raw[4 + 7, 3] = 0.6
    xyxy, score, cls = decode_ultralytics(raw)
    assert xyxy[3].tolist() == pytest.approx([90, 45, 110, 55])
    assert (score[3], cls[3]) == (pytest.approx(0.6), 7)


def test_select_is_class_aware_and_maps_to_source() -> None:
    lb = Letterbox.fit(832, 624, 416, 416)  # scale 0.5
    xyxy = np.array([[10, 10, 50, 50], [11, 11, 51, 51], [10, 10, 50, 50]], np.float32)
    score = np.array([0.9, 0.8, 0.7], np.float32)
    cls = np.array([0, 0, 1], np.int32)
    det = select(xyxy, score, cls, lb, PostprocessSettings(confidence_threshold=0.1))
    assert det.class_id.tolist() == [0, 1]  # same-class overlap removed, other class kept
    assert det.xyxy[0].tolist() == pytest.approx([20, 20, 100, 100])


def test_boxes_are_clipped_to_source_frame() -> None:
    lb = Letterbox.fit(640, 480, 416, 416)
    out = lb.to_source(np.array([[-10, -10, 500, 400]], np.float32))
    assert out[0].tolist() == pytest.approx([0, 0, 640, 480])


@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.3, 0.6])
def test_skipping_rows_below_the_threshold_changes_no_detection(threshold: float) -> None:
    """decode_yolox(min_score=t) skips rows whose objectness is not above t: with the
    export's probabilities (0..1) their score cannot pass t, so select keeps the same."""
    rng = np.random.default_rng(7)
    grid = yolox_grid(416, 416)
    raw = rng.uniform(0.0, 1.0, (grid.shape[0], 85)).astype(np.float32)
    raw[:, :4] = rng.normal(0.0, 1.0, (grid.shape[0], 4))
    raw[:, 4] **= 4  # most rows unlikely objects, as in a real frame
    letterbox = Letterbox(src_w=640, src_h=480, dst_w=416, dst_h=416, scale=0.65, pad_y=52)
    settings = PostprocessSettings(confidence_threshold=threshold)
    full = select(*decode_yolox(raw, grid), letterbox, settings)
    skipped = select(*decode_yolox(raw, grid, threshold), letterbox, settings)
    assert len(full) > 0
    assert full.equals(skipped, atol=0.0)
