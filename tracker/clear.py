"""CLEAR MOT (MOTA, MOTP) and identity (IDF1) metrics, as TrackEval computes them.

TrackEval (``metrics.CLEAR``, ``metrics.Identity``) is what MOTChallenge scores
with; it reproduces the benchmark's original devkit. Input frames come from
:func:`tracker.mot_gt.preprocess_frame`, so these figures, HOTA
(:mod:`tracker.hota`) and every other one see the same boxes.

* **CLEAR.** Per frame, targets and tracker boxes are matched one to one
  (Hungarian) at IoU >= 0.5, keeping first the pairs that were matched in the
  previous frame, then maximising IoU. An ID switch is a target matched to
  another tracker id than the last one it was matched to (any number of frames
  before). MOTA = 1 - (misses + false positives + ID switches) / targets;
  MOTP is the mean IoU of the matches.
* **Identity.** Each target id gets at most one tracker id for the whole
  sequence, chosen to maximise the frames where the two overlap at IoU >= 0.5
  (IDTP); IDF1 = 2 IDTP / (targets + tracker boxes).

py-motmetrics gives the same IDF1. Its ID switches can differ from TrackEval's
by a few: after a frame where a target was missed, motmetrics still prefers its
old tracker id while TrackEval rematches by IoU (measured on KITTI-17: 2 vs 4
switches, MOTA 0.635 vs 0.633).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from tracker.mot_gt import MATCH_IOU, ScoredFrame, dense_ids

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True, slots=True)
class ClearScores:
    """CLEAR MOT and identity figures of one sequence."""

    mota: float
    motp: float
    idf1: float
    id_switches: int
    matches: int
    false_positives: int
    misses: int
    precision: float
    recall: float


@dataclass(slots=True)
class _Clear:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    idsw: int = 0
    iou_sum: float = 0.0


def _match(iou: F64, g: I64, t: I64, prev_step: F64) -> tuple[I64, I64]:
    """One frame's matches: continuing pairs first, then the most overlap."""
    score = 1000.0 * (t[np.newaxis, :] == prev_step[g][:, np.newaxis]) + iou
    score[iou < MATCH_IOU - _EPS] = 0.0
    rows, cols = linear_sum_assignment(score, maximize=True)
    ok = score[rows, cols] > _EPS
    return rows[ok], cols[ok]


def _clear_counts(frames: Sequence[ScoredFrame], gts: Sequence[I64], trks: Sequence[I64],
                  n_gt: int) -> _Clear:  # fmt: skip
    c = _Clear()
    last = np.full(n_gt, np.nan)  # last tracker id each target was matched to
    prev_step = np.full(n_gt, np.nan)  # ... in the previous frame only
    for f, g, t in zip(frames, gts, trks, strict=True):
        if len(g) == 0 or len(t) == 0:
            c.fp, c.fn = c.fp + len(t), c.fn + len(g)  # and prev_step stays, as in TrackEval
            continue
        rows, cols = _match(f.iou, g, t, prev_step)
        mg, mt = g[rows], t[cols]
        before = last[mg]
        c.idsw += int(np.sum(~np.isnan(before) & (mt != before)))
        last[mg] = mt
        prev_step[:] = np.nan
        prev_step[mg] = mt
        c.tp += len(rows)
        c.fn += len(g) - len(rows)
        c.fp += len(t) - len(rows)
        c.iou_sum += float(f.iou[rows, cols].sum())
    return c


def _idtp(frames: Sequence[ScoredFrame], gts: Sequence[I64], trks: Sequence[I64],
          n_gt: int, n_trk: int) -> int:  # fmt: skip
    """Frames matched under the best one-to-one map of target ids to tracker ids."""
    overlap = np.zeros((n_gt, n_trk))
    for f, g, t in zip(frames, gts, trks, strict=True):
        r, k = np.nonzero(f.iou >= MATCH_IOU)
        np.add.at(overlap, (g[r], t[k]), 1)
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    return int(overlap[rows, cols].sum())


def clear(frames: Sequence[ScoredFrame]) -> ClearScores:
    """MOTA, MOTP, IDF1 and their counts over preprocessed ``frames``."""
    gts, n_gt = dense_ids([f.gt_ids for f in frames])
    trks, n_trk = dense_ids([f.ids for f in frames])
    n_targets = sum(len(g) for g in gts)
    n_boxes = sum(len(t) for t in trks)
    c = _clear_counts(frames, gts, trks, n_gt)
    idtp = _idtp(frames, gts, trks, n_gt, n_trk) if n_gt and n_trk else 0
    return ClearScores(
        mota=(c.tp - c.fp - c.idsw) / max(1, c.tp + c.fn),
        motp=c.iou_sum / max(1, c.tp),
        idf1=2 * idtp / max(1, n_targets + n_boxes),
        id_switches=c.idsw,
        matches=c.tp,
        false_positives=c.fp,
        misses=c.fn,
        precision=c.tp / max(1, c.tp + c.fp),
        recall=c.tp / max(1, c.tp + c.fn),
    )
