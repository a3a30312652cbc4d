"""Similarity and assignment: the building blocks of every association stage.

A stage scores every (track, detection) pair, marks which pairs are allowed
(the gate: enough IoU, same class when matching is class-aware) and solves one
linear assignment that maximises the total of ``score - threshold`` over the
chosen pairs, so a pair is only taken when it scores above the threshold (the
ByteTrack convention, via ``lap.lapjv`` with a cost limit).
"""

from __future__ import annotations

import lap
import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
_EMPTY = np.empty(0, np.int64)


def iou_matrix(a: NDArray[np.floating], b: NDArray[np.floating]) -> F64:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), xyxy."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return np.zeros((a.shape[0], b.shape[0]))
    ix1 = np.maximum(a[:, None, 0], b[None, :, 0])
    iy1 = np.maximum(a[:, None, 1], b[None, :, 1])
    ix2 = np.minimum(a[:, None, 2], b[None, :, 2])
    iy2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(ix2 - ix1, 0.0, None) * np.clip(iy2 - iy1, 0.0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    out: F64 = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return out


def assign(score: F64, allowed: NDArray[np.bool_], threshold: float) -> tuple[I64, I64]:
    """Pairs ``(rows, cols)`` maximising the sum of ``score - threshold``.

    Only ``allowed`` pairs whose score exceeds ``threshold`` can be chosen; every
    row and column is used at most once. Rows come out in ascending order.
    """
    n, m = score.shape
    if n == 0 or m == 0:
        return _EMPTY, _EMPTY
    cost = np.where(allowed, threshold - score, 1.0)
    _, x, _ = lap.lapjv(np.ascontiguousarray(cost), extend_cost=True, cost_limit=0.0)
    rows = np.flatnonzero(x >= 0)
    cols = x[rows].astype(np.int64)
    keep = allowed[rows, cols] & (score[rows, cols] > threshold)
    return rows[keep].astype(np.int64), cols[keep]


def direction_score(
    direction: F64, anchor: F64, centers: F64, weight: NDArray[np.floating]
) -> F64:
    """OC-SORT's momentum term: agreement of each track's motion direction with
    the direction from the track's anchor observation to each detection.

    ``direction`` (N, 2) unit vectors (zero where unknown), ``anchor`` (N, 2)
    anchor centres, ``centers`` (M, 2) detection centres, ``weight`` (M,) per
    detection (its confidence times the setting). Returns (N, M) values in
    ``[-0.5, 0.5] * weight``, zero for tracks without a direction.
    """
    delta = centers[None, :, :] - anchor[:, None, :]
    norm = np.sqrt((delta**2).sum(axis=2))
    norm = np.where(norm > 1e-6, norm, 1.0)
    cos = (delta * direction[:, None, :]).sum(axis=2) / norm
    angle = np.arccos(np.clip(cos, -1.0, 1.0))
    known = (np.abs(direction).sum(axis=1) > 0)[:, None]
    out: F64 = np.where(known, (np.pi / 2 - angle) / np.pi, 0.0) * weight[None, :]
    return out


__all__ = ["assign", "direction_score", "iou_matrix"]
