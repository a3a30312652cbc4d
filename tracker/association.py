"""Similarity and assignment: the building blocks of every association stage.

A stage takes the candidate (track, detection) pairs that pass its gate
(enough IoU, same class when matching is class-aware, score above the stage's
threshold) and solves one linear assignment that maximises the total of
``score - threshold`` over the chosen pairs (the ByteTrack convention). IoU is
computed once per update for all pairs; everything after works on the sparse
list of pairs with any overlap, which keeps large scenes cheap. The solver is
scipy's ``linear_sum_assignment``, which on these small problems costs far less
per call than ``lap.lapjv``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
_EMPTY = np.empty(0, np.int64)
_DENSE_CELLS = 1600
"""Up to this many cells the assignment runs on the full (rows, cols) matrix;
larger problems are first reduced to the rows and columns with candidates."""


def iou_matrix(a: NDArray[np.floating], b: NDArray[np.floating]) -> F64:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), xyxy."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return np.zeros((a.shape[0], b.shape[0]))
    bt = b.T
    iw = np.minimum(a[:, 2:3], bt[2]) - np.maximum(a[:, 0:1], bt[0])
    ih = np.minimum(a[:, 3:4], bt[3]) - np.maximum(a[:, 1:2], bt[1])
    np.maximum(iw, 0.0, out=iw)
    np.maximum(ih, 0.0, out=ih)
    inter = iw * ih
    area_a = (a[:, 2:3] - a[:, 0:1]) * (a[:, 3:4] - a[:, 1:2])
    area_b = (bt[2] - bt[0]) * (bt[3] - bt[1])
    union = area_a + area_b
    union -= inter
    np.maximum(union, 1e-12, out=union)
    out: F64 = inter / union
    return out


def grown_iou(a: F64, b: F64, ratio: F64) -> F64:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), both grown
    on every side by ``ratio[i]`` (N,) of their own size for row ``i`` (C-BIoU's
    buffer, one buffer per row): (N, M)."""
    if a.shape[0] == 0 or b.shape[0] == 0:
        return np.zeros((a.shape[0], b.shape[0]))
    r = ratio[:, np.newaxis]
    a_size = a[:, 2:4] - a[:, 0:2]
    a_lo, a_hi = a[:, 0:2] - r * a_size, a[:, 2:4] + r * a_size
    b_size = b[:, 2:4] - b[:, 0:2]
    bw, bh = b_size[:, 0], b_size[:, 1]
    b_x1, b_x2 = b[:, 0] - r * bw, b[:, 2] + r * bw  # (N, M)
    b_y1, b_y2 = b[:, 1] - r * bh, b[:, 3] + r * bh
    iw = np.minimum(a_hi[:, 0:1], b_x2) - np.maximum(a_lo[:, 0:1], b_x1)
    ih = np.minimum(a_hi[:, 1:2], b_y2) - np.maximum(a_lo[:, 1:2], b_y1)
    inter = np.maximum(iw, 0.0) * np.maximum(ih, 0.0)
    area_a = ((a_hi - a_lo)[:, 0] * (a_hi - a_lo)[:, 1])[:, np.newaxis]
    area_b = (b_x2 - b_x1) * (b_y2 - b_y1)
    out: F64 = inter / np.maximum(area_a + area_b - inter, 1e-12)
    return out


def height_iou(a: F64, b: F64) -> F64:
    """Overlap of the vertical extents of row-aligned boxes ``a`` and ``b`` (K, 4):
    intersection over union of ``[y1, y2]`` (Hybrid-SORT's height modulation)."""
    inter = np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1])
    union = np.maximum(a[:, 3], b[:, 3]) - np.minimum(a[:, 1], b[:, 1])
    out: F64 = np.maximum(inter, 0.0) / np.maximum(union, 1e-12)
    return out


def assign(rows: I64, cols: I64, gain: F64) -> tuple[I64, I64]:
    """Choose candidate pairs ``(rows[k], cols[k])`` maximising the total ``gain``.

    Every candidate must have a positive gain (its score minus the stage's
    threshold); each row and each column is used at most once. When no row
    and no column appears twice the answer is all candidates; otherwise the
    rows and columns involved form a small dense problem solved exactly with
    scipy's ``linear_sum_assignment`` (a zero-cost cell means "not a
    candidate", which is the same as leaving both unmatched). Returns the
    chosen ``(rows, cols)``.
    """
    if rows.size == 0:
        return _EMPTY, _EMPTY
    if rows.size == 1:
        return rows, cols
    row_count = np.bincount(rows)
    col_count = np.bincount(cols)
    if not np.count_nonzero(row_count > 1) and not np.count_nonzero(col_count > 1):
        return rows, cols
    if row_count.size * col_count.size <= _DENSE_CELLS:
        cost = np.zeros((row_count.size, col_count.size))
        cost[rows, cols] = -gain
        r, c = linear_sum_assignment(cost)
        keep = cost[r, c] < 0.0
        return r[keep].astype(np.int64), c[keep].astype(np.int64)
    urows, ucols, cost = compact_cost(rows, cols, gain)
    r, c = linear_sum_assignment(cost)
    keep = cost[r, c] < 0.0
    return urows[r[keep]].astype(np.int64), ucols[c[keep]].astype(np.int64)


def compact_cost(rows: I64, cols: I64, gain: F64) -> tuple[I64, I64, F64]:
    """The candidates as a dense cost matrix over only the rows and columns they use:
    ``(rows used, cols used, cost)`` with ``-gain`` at each candidate, 0 elsewhere
    ("not a candidate", the same as leaving both unmatched)."""
    urows, rinv = np.unique(rows, return_inverse=True)
    ucols, cinv = np.unique(cols, return_inverse=True)
    cost = np.zeros((urows.size, ucols.size))
    cost[rinv, cinv] = -gain
    return urows, ucols, cost


def direction_score(motion: F64, anchor: F64, centers: F64, weight: NDArray[np.floating]) -> F64:
    """OC-SORT's momentum term for K candidate pairs (all arguments row-aligned).

    Agreement of each track's recent ``motion`` (K, 2), the vector from its
    ``anchor`` observation (K, 2) to its latest one (zero where unknown), with
    the vector from the anchor to the detection's centre (K, 2):
    ``(pi/2 - angle) / pi`` in ``[-0.5, 0.5]``, times ``weight`` (K,); 0 where
    either vector is zero.
    """
    delta = centers - anchor
    norms = np.hypot(delta[:, 0], delta[:, 1]) * np.hypot(motion[:, 0], motion[:, 1])
    cos = (delta[:, 0] * motion[:, 0] + delta[:, 1] * motion[:, 1]) / np.maximum(norms, 1e-9)
    # (pi/2 - arccos(cos)) / pi == arcsin(cos) / pi
    out: F64 = np.arcsin(np.clip(cos, -1.0, 1.0, out=cos), out=cos)
    out *= weight
    out *= 1.0 / np.pi
    return out


__all__ = ["assign", "direction_score", "height_iou", "iou_matrix"]
