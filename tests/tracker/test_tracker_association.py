"""IoU, the thresholded assignment and the OC-SORT direction term."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tracker.association import assign, direction_score, grown_iou, iou_matrix


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ([0, 0, 10, 10], [0, 0, 10, 10], 1.0),
        ([0, 0, 10, 10], [20, 20, 30, 30], 0.0),
        ([0, 0, 10, 10], [5, 0, 15, 10], 50 / 150),
        ([0, 0, 10, 10], [2, 2, 4, 4], 4 / 100),
        ([0, 0, 10, 10], [10, 0, 20, 10], 0.0),  # touching edges
        ([0, 0, 0, 0], [0, 0, 0, 0], 0.0),  # zero area: no division by zero
    ],
)
def test_iou_table(a: list[float], b: list[float], want: float) -> None:
    got = iou_matrix(np.array([a], float), np.array([b], float))
    assert got.shape == (1, 1)
    assert got[0, 0] == pytest.approx(want)


@pytest.mark.parametrize(("n", "m"), [(0, 0), (0, 3), (4, 0)])
def test_iou_empty_shapes(n: int, m: int) -> None:
    assert iou_matrix(np.zeros((n, 4)), np.zeros((m, 4))).shape == (n, m)


def _grow(xyxy: np.ndarray, ratio: float) -> np.ndarray:
    pad = ratio * (xyxy[:, 2:4] - xyxy[:, 0:2])
    return np.concatenate([xyxy[:, 0:2] - pad, xyxy[:, 2:4] + pad], axis=1)


def test_grown_iou_is_iou_of_grown_boxes() -> None:
    """Row i of grown_iou is the IoU of box i and every b, all grown by ratio[i]."""
    rng = np.random.default_rng(3)
    a = np.sort(rng.uniform(0, 200, (5, 2, 2)), axis=1).reshape(5, 4)
    b = np.sort(rng.uniform(0, 200, (7, 2, 2)), axis=1).reshape(7, 4)
    ratio = np.array([0.0, 0.1, 0.35, 1.0, 0.5])
    got = grown_iou(a, b, ratio)
    assert got.shape == (5, 7)
    for i, r in enumerate(ratio):
        np.testing.assert_allclose(got[i], iou_matrix(_grow(a[i : i + 1], r), _grow(b, r))[0])
    np.testing.assert_allclose(got[0], iou_matrix(a[:1], b)[0])
    assert grown_iou(a[:0], b, ratio[:0]).shape == (0, 7)
    assert grown_iou(a, b[:0], ratio).shape == (5, 0)


def test_iou_is_symmetric_and_bounded() -> None:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, (30, 2))
    boxes = np.hstack([xy, xy + rng.uniform(1, 50, (30, 2))])
    got = iou_matrix(boxes, boxes)
    assert np.allclose(got, got.T)
    assert np.allclose(np.diag(got), 1.0)
    assert (got >= 0).all() and (got <= 1 + 1e-12).all()


def _pairs(matrix: list[list[float]], thr: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    score = np.array(matrix, float)
    r, c = np.nonzero(score > thr)
    return r.astype(np.int64), c.astype(np.int64), score[r, c] - thr


@pytest.mark.parametrize(
    ("score", "thr", "want"),
    [
        # one clear match per row
        ([[0.9, 0.0], [0.0, 0.8]], 0.2, {(0, 0), (1, 1)}),
        # conflict: the strong pair wins over two weak ones (ByteTrack semantics)
        ([[0.9, 0.3], [0.35, 0.0]], 0.2, {(0, 0)}),
        # conflict: two good pairs beat one great pair
        ([[0.9, 0.8], [0.85, 0.0]], 0.2, {(0, 1), (1, 0)}),
        # nothing above threshold
        ([[0.1, 0.15]], 0.2, set()),
        # more tracks than detections
        ([[0.5], [0.7], [0.6]], 0.3, {(1, 0)}),
    ],
)
def test_assign_table(score: list[list[float]], thr: float, want: set[tuple[int, int]]) -> None:
    r, c = assign(*_pairs(score, thr))
    assert set(zip(r.tolist(), c.tolist(), strict=True)) == want


def _brute_force(score: np.ndarray, thr: float) -> float:
    n, m = score.shape
    best = 0.0
    for k in range(min(n, m) + 1):
        for rows in itertools.combinations(range(n), k):
            for cols in itertools.permutations(range(m), k):
                gain = sum(max(score[r, c] - thr, -1e9) for r, c in zip(rows, cols, strict=True))
                if all(score[r, c] > thr for r, c in zip(rows, cols, strict=True)):
                    best = max(best, gain)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_assign_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = rng.integers(1, 5, 2)
    score = np.where(rng.random((n, m)) < 0.6, rng.random((n, m)), 0.0)
    r, c = assign(*_pairs(score.tolist(), 0.3))
    assert len(set(r.tolist())) == r.size and len(set(c.tolist())) == c.size
    assert (score[r, c] > 0.3).all()
    assert (score[r, c] - 0.3).sum() == pytest.approx(_brute_force(score, 0.3))


@pytest.mark.parametrize(
    ("direction", "anchor", "center", "want"),
    [
        ([1, 0], [0, 0], [10, 0], 0.5),  # same direction
        ([1, 0], [0, 0], [-10, 0], -0.5),  # opposite
        ([1, 0], [0, 0], [0, 10], 0.0),  # perpendicular
        ([0, 0], [0, 0], [10, 0], 0.0),  # track has no direction yet
        ([0, 1], [5, 5], [5, 5], 0.0),  # detection exactly at the anchor
    ],
)
def test_direction_score_table(
    direction: list[float], anchor: list[float], center: list[float], want: float
) -> None:
    got = direction_score(
        np.array([direction], float),
        np.array([anchor], float),
        np.array([center], float),
        np.array([1.0]),
    )
    assert got[0] == pytest.approx(want, abs=1e-9)
