"""MOTChallenge ground truth in its two layouts, and the benchmark's preprocessing.

Two layouts of ``gt.txt`` are in use (both comma-separated, one box per row):

* **MOT15** (10 columns): ``frame, id, left, top, width, height, conf, x, y, z``.
  Rows with ``conf == 0`` are not evaluated; every other row is a target.
* **MOT16** (9 columns, also MOT17): ``frame, id, left, top, width, height,
  consider, class, visibility``. Targets are the rows with ``consider == 1`` and
  ``class == 1`` (pedestrian). The other rows are other classes (cars, occluders,
  ...), distractors or ignored people.

The layout is read from the number of columns (:func:`detect_layout`); anything
else is refused with a :class:`GroundTruthError` naming both layouts.

Preprocessing (:func:`preprocess`) follows TrackEval's ``MotChallenge2DBox``
(``get_preprocessed_seq_data``) for MOT16 and py-motmetrics' MOT16 mode
(``preprocess.preprocessResult``): in each frame the tracker's boxes are matched to
*all* ground-truth rows of that frame (Hungarian, maximising IoU, a pair only at
IoU >= 0.5); a tracker box matched to a row of a distractor class
(person_on_vehicle 2, static_person 7, distractor 8, reflection 12) is removed, so
it is neither a false positive nor a miss. Then only the target rows are kept.
Like both references, a box matched to any other non-target row (an occluder, a
car, a pedestrian row with ``consider == 0``) is kept and counts as a false
positive. MOT15 has no preprocessing (as in both references): only ``conf == 0``
rows are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from framerelay.errors import ConfigError
from tracker.association import iou_matrix

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

PEDESTRIAN = 1
DISTRACTOR_CLASSES = (2, 7, 8, 12)
"""person_on_vehicle, static_person, distractor, reflection (MOT16/MOT17)."""
CLASSES = range(1, 14)
"""MOT16's classes: pedestrian 1 ... crowd 13."""
MATCH_IOU = 0.5
_EPS = float(np.finfo(np.float64).eps)


class GroundTruthError(ConfigError):
    """A ground-truth file that is neither layout, or has impossible values."""


class Layout(StrEnum):
    MOT15 = "mot15"
    MOT16 = "mot16"


COLUMNS = {10: Layout.MOT15, 9: Layout.MOT16}
"""How the layout is told from a file: its number of columns."""
NEEDED = {Layout.MOT15: 7, Layout.MOT16: 8}
"""Columns read in each layout (an explicitly named layout may have fewer than listed)."""


@dataclass(frozen=True, slots=True)
class GtFrame:
    """Every ground-truth row of one frame: ``ids``, ``xyxy`` and each row's role."""

    ids: I64
    xyxy: F64
    target: BoolArray
    distractor: BoolArray

    @property
    def target_ids(self) -> I64:
        return self.ids[self.target]

    @property
    def target_xyxy(self) -> F64:
        return self.xyxy[self.target]


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """A sequence's ground truth: its layout and the rows of every annotated frame."""

    layout: Layout
    frames: dict[int, GtFrame]

    def frame(self, index: int) -> GtFrame:
        """Frame ``index`` (1-based); an empty frame when nothing is annotated."""
        return self.frames.get(index, _EMPTY_FRAME)

    @property
    def targets(self) -> int:
        """Number of target boxes (what a perfect tracker would report)."""
        return sum(int(f.target.sum()) for f in self.frames.values())


_EMPTY_FRAME = GtFrame(
    np.empty(0, np.int64), np.empty((0, 4)), np.empty(0, np.bool_), np.empty(0, np.bool_)
)


@dataclass(frozen=True, slots=True)
class ScoredFrame:
    """One frame ready for scoring: targets, the tracker's kept boxes, their IoU."""

    index: int
    gt_ids: I64
    gt_xyxy: F64
    ids: I64
    xyxy: F64
    iou: F64
    removed: int
    """Tracker boxes removed because they matched a distractor."""


# --------------------------------------------------------------------- reading


def detect_layout(rows: F64, source: str = "ground truth") -> Layout:
    """The layout of parsed ``gt.txt`` rows, from their number of columns."""
    n = rows.shape[1]
    if n not in COLUMNS:
        raise GroundTruthError(
            f"{source}: {n} columns per row is neither MOTChallenge ground-truth layout: "
            "MOT15 has 10 (frame,id,left,top,width,height,conf,x,y,z), MOT16/MOT17 has 9 "
            "(frame,id,left,top,width,height,consider,class,visibility)"
        )
    return COLUMNS[n]


def _check_mot16(rows: F64, source: str) -> None:
    consider, cls = rows[:, 6], rows[:, 7]
    if not np.isin(consider, (0, 1)).all():
        raise GroundTruthError(f"{source}: MOT16 layout wants consider 0 or 1 in column 7")
    if not np.isin(cls, CLASSES).all():
        bad = sorted({float(c) for c in cls[~np.isin(cls, CLASSES)]})[:5]
        raise GroundTruthError(
            f"{source}: MOT16 layout wants a class 1-13 in column 8, found {bad}"
        )


def _roles(rows: F64, layout: Layout) -> tuple[BoolArray, BoolArray]:
    if layout is Layout.MOT15:
        return rows[:, 6] != 0, np.zeros(len(rows), np.bool_)
    target = (rows[:, 6] == 1) & (rows[:, 7] == PEDESTRIAN)
    return target, np.isin(rows[:, 7], DISTRACTOR_CLASSES)


def parse_gt(rows: F64, layout: Layout | None = None, source: str = "ground truth") -> GroundTruth:
    """Ground truth from parsed rows (layout detected unless given)."""
    rows = np.asarray(rows, np.float64).reshape(len(rows), -1)
    layout = detect_layout(rows, source) if layout is None else Layout(layout)
    if rows.shape[1] < NEEDED[layout]:
        raise GroundTruthError(
            f"{source}: {rows.shape[1]} columns, the {layout} layout needs {NEEDED[layout]}"
        )
    if layout is Layout.MOT16:
        _check_mot16(rows, source)
    target, distractor = _roles(rows, layout)
    frames: dict[int, GtFrame] = {}
    order = np.argsort(rows[:, 0], kind="stable")
    rows, target, distractor = rows[order], target[order], distractor[order]
    numbers, starts = np.unique(rows[:, 0].astype(np.int64), return_index=True)
    for number, a, b in zip(numbers, starts, [*starts[1:], len(rows)], strict=True):
        r = rows[a:b]
        xyxy = np.column_stack([r[:, 2], r[:, 3], r[:, 2] + r[:, 4], r[:, 3] + r[:, 5]])
        frames[int(number)] = GtFrame(r[:, 1].astype(np.int64), xyxy, target[a:b], distractor[a:b])
    return GroundTruth(layout, frames)


def load_gt(path: Path, layout: Layout | None = None) -> GroundTruth:
    """Read a MOTChallenge ``gt.txt`` in either layout (detected unless given)."""
    try:
        rows = np.loadtxt(path, delimiter=",", ndmin=2)
    except ValueError as exc:
        raise GroundTruthError(f"{path}: not a comma-separated table of numbers ({exc})") from exc
    if rows.size == 0:
        raise GroundTruthError(f"{path}: no rows")
    return parse_gt(rows, layout, str(path))


# --------------------------------------------------------------------- preprocessing


def dense_ids(per_frame: Sequence[I64]) -> tuple[list[I64], int]:
    """Each frame's ids relabelled 0..n-1 over the whole sequence, and n."""
    unique = np.unique(np.concatenate([np.empty(0, np.int64), *per_frame]))
    return [np.searchsorted(unique, i).astype(np.int64) for i in per_frame], len(unique)


def distractor_matches(gt: GtFrame, xyxy: F64) -> BoolArray:
    """Which tracker boxes match (IoU >= 0.5, Hungarian over all rows) a distractor row."""
    out = np.zeros(len(xyxy), np.bool_)
    if not gt.distractor.any() or len(xyxy) == 0:
        return out
    sim = iou_matrix(gt.xyxy, xyxy)
    sim[sim < MATCH_IOU - _EPS] = 0.0
    rows, cols = linear_sum_assignment(sim, maximize=True)
    matched = sim[rows, cols] > _EPS
    rows, cols = rows[matched], cols[matched]
    out[cols[gt.distractor[rows]]] = True
    return out


def preprocess_frame(
    index: int, gt: GtFrame, ids: NDArray[np.integer], xyxy: NDArray[np.floating]
) -> ScoredFrame:
    """One frame after the benchmark's preprocessing (see the module's docstring)."""
    boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
    drop = distractor_matches(gt, boxes)
    keep_ids, keep_xyxy = np.asarray(ids, np.int64)[~drop], boxes[~drop]
    gt_xyxy = gt.target_xyxy
    return ScoredFrame(
        index=index,
        gt_ids=gt.target_ids,
        gt_xyxy=gt_xyxy,
        ids=keep_ids,
        xyxy=keep_xyxy,
        iou=iou_matrix(gt_xyxy, keep_xyxy),
        removed=int(drop.sum()),
    )
