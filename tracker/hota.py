"""HOTA (Luiten et al., IJCV 2021), computed as TrackEval's ``metrics.HOTA`` does.

For every localisation threshold alpha in 0.05, 0.10, ..., 0.95:

1. each frame's targets and tracker boxes are matched one to one (Hungarian)
   maximising IoU weighted by the *global alignment* of the two ids over the
   whole sequence (how often they overlap, Jaccard-style, over how often either
   appears); a pair counts (a TP) only at IoU >= alpha;
2. DetA = TP / (TP + FN + FP);
3. AssA = the mean over TPs of TPA / (TPA + FNA + FPA) for the TP's pair of ids
   (TPA: frames where the pair is matched; FNA/FPA: the rest of either id's frames);
4. HOTA = sqrt(DetA x AssA); LocA = mean IoU of the TPs.

The reported figures are the means over the 19 thresholds. Input frames come
from :func:`tracker.mot_gt.preprocess_frame` (targets only, distractor matches
removed), so HOTA sees exactly what MOTA and IDF1 see. Checked against TrackEval
on real sequences in ``tests/tracker/test_tracker_mot16.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from tracker.mot_gt import ScoredFrame, dense_ids

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
ALPHAS: F64 = np.arange(0.05, 0.99, 0.05)
"""The 19 localisation thresholds, computed exactly as TrackEval does."""
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True, slots=True)
class HotaScores:
    """Means over the thresholds in :data:`ALPHAS`."""

    hota: float
    deta: float
    assa: float
    loca: float


@dataclass(slots=True)
class _Totals:
    tp: F64
    fn: F64
    fp: F64
    loc: F64
    matches: F64
    """(alpha, gt id, tracker id) -> frames where the pair is a TP."""


def _sim_jaccard(sim: F64) -> F64:
    """Each pair's IoU over (row sum + column sum - IoU): its share of the overlaps."""
    denom = sim.sum(0)[np.newaxis, :] + sim.sum(1)[:, np.newaxis] - sim
    out = np.zeros_like(sim)
    mask = denom > _EPS
    out[mask] = sim[mask] / denom[mask]
    return out


def _alignment(
    frames: Sequence[ScoredFrame], gts: Sequence[I64], trks: Sequence[I64], n_gt: int, n_trk: int
) -> tuple[F64, F64, F64]:
    """Global alignment score of every (gt id, tracker id), and each id's frame count."""
    potential = np.zeros((n_gt, n_trk))
    gt_count = np.zeros((n_gt, 1))
    trk_count = np.zeros((1, n_trk))
    for f, g, t in zip(frames, gts, trks, strict=True):
        potential[g[:, np.newaxis], t[np.newaxis, :]] += _sim_jaccard(f.iou)
        np.add.at(gt_count[:, 0], g, 1)
        np.add.at(trk_count[0], t, 1)
    denom = gt_count + trk_count - potential
    score = np.divide(potential, denom, out=np.zeros_like(potential), where=denom > 0)
    return score, gt_count, trk_count


def _match_frame(totals: _Totals, iou: F64, align: F64, g: I64, t: I64) -> None:
    """Match one frame at every threshold and add it to ``totals``."""
    if len(g) == 0 or len(t) == 0:
        totals.fn += len(g)
        totals.fp += len(t)
        return
    rows, cols = linear_sum_assignment(align[g[:, np.newaxis], t[np.newaxis, :]] * iou, True)
    sims = iou[rows, cols]
    ok = sims[np.newaxis, :] >= ALPHAS[:, np.newaxis] - _EPS  # (alpha, pair)
    tp = ok.sum(1)
    totals.tp += tp
    totals.fn += len(g) - tp
    totals.fp += len(t) - tp
    totals.loc += (ok * sims[np.newaxis, :]).sum(1)
    a_idx, pair = np.nonzero(ok)
    np.add.at(totals.matches, (a_idx, g[rows[pair]], t[cols[pair]]), 1)


def hota(frames: Sequence[ScoredFrame]) -> HotaScores:
    """HOTA, DetA, AssA and LocA of a tracker's preprocessed frames."""
    gts, n_gt = dense_ids([f.gt_ids for f in frames])
    trks, n_trk = dense_ids([f.ids for f in frames])
    n_alpha = len(ALPHAS)
    if n_gt == 0 or n_trk == 0:  # TrackEval: no detections at all on one side
        return HotaScores(0.0, 0.0, 0.0, 1.0)
    align, gt_count, trk_count = _alignment(frames, gts, trks, n_gt, n_trk)
    zeros = np.zeros(n_alpha)
    totals = _Totals(zeros.copy(), zeros.copy(), zeros.copy(), zeros.copy(),
                     np.zeros((n_alpha, n_gt, n_trk)))  # fmt: skip
    for f, g, t in zip(frames, gts, trks, strict=True):
        _match_frame(totals, f.iou, align, g, t)
    m = totals.matches
    ass = (m * m / np.maximum(1, gt_count + trk_count - m)).sum((1, 2))
    assa = ass / np.maximum(1, totals.tp)
    deta = totals.tp / np.maximum(1, totals.tp + totals.fn + totals.fp)
    loca = np.maximum(1e-10, totals.loc) / np.maximum(1e-10, totals.tp)
    return HotaScores(
        hota=float(np.mean(np.sqrt(deta * assa))),
        deta=float(np.mean(deta)),
        assa=float(np.mean(assa)),
        loca=float(np.mean(loca)),
    )
