"""Did track ids survive an outage? Judged against the clip's ground truth.

A track counts when it was alive (a confirmed id on a ground-truth person, IoU
>= 0.5) in the last result before the outage. It is *eligible* when its person
is still in view after the outage (a target that walked out during it cannot
keep its id, and must not). It *kept its id* when that id is on the same
person in a result after the outage; an id that turns up on another person is
counted as *wrong* (a continued id that is a lie is worse than a new one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from framerelay.results import ResultRecord
from tracker.association import iou_matrix
from tracker.mot_gt import GroundTruth, load_gt

MATCH_IOU = 0.5


@dataclass(frozen=True, slots=True)
class Continuity:
    alive: int
    """Confirmed tracks on a ground-truth person in the last result before."""
    eligible: int
    """Of those, tracks whose person is in view after the outage."""
    kept: int
    """Eligible tracks whose id is on the same person after."""
    wrong: int
    """Eligible tracks whose id is on another person after."""
    any_id_kept: int
    """Ids alive before (on anyone or no one) that appear anywhere after."""
    ids_before: int
    """Confirmed ids in the last result before."""

    def __add__(self, other: Continuity) -> Continuity:
        return Continuity(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(c: Continuity) -> tuple[int, ...]:
    return (c.alive, c.eligible, c.kept, c.wrong, c.any_id_kept, c.ids_before)


def frame_index(record: ResultRecord, fps: float) -> int:
    """The 1-based MOT frame number of a result (its PTS time times the clip's rate)."""
    return round(record.pts_time * fps) + 1


def on_people(record: ResultRecord, gt: GroundTruth, fps: float) -> dict[int, int]:
    """Tracker id -> ground-truth person for one result (one-to-one, IoU >= 0.5)."""
    dets = [d for d in record.detections if d.tracker_id > 0]
    frame = gt.frame(frame_index(record, fps))
    people = frame.ids[frame.target]
    if not dets or people.size == 0:
        return {}
    iou = iou_matrix(np.array([d.box for d in dets]), frame.xyxy[frame.target])
    rows, cols = linear_sum_assignment(-iou)
    return {
        dets[r].tracker_id: int(people[c])
        for r, c in zip(rows, cols, strict=True)
        if iou[r, c] >= MATCH_IOU
    }


def in_view(records: Sequence[ResultRecord], gt: GroundTruth, fps: float) -> set[int]:
    """Ground-truth people in any of ``records``' frames."""
    seen: set[int] = set()
    for r in records:
        frame = gt.frame(frame_index(r, fps))
        seen.update(int(i) for i in frame.ids[frame.target])
    return seen


def continuity(
    last_before: ResultRecord, after: Sequence[ResultRecord], gt: GroundTruth, fps: float
) -> Continuity:
    """How the ids of ``last_before`` fared in ``after`` (see the module doc)."""
    before = on_people(last_before, gt, fps)
    visible = in_view(after, gt, fps)
    where: dict[int, set[int]] = {}
    for r in after:
        for tid, person in on_people(r, gt, fps).items():
            where.setdefault(tid, set()).add(person)
    eligible = {tid: p for tid, p in before.items() if p in visible}
    kept = sum(p in where.get(tid, set()) for tid, p in eligible.items())
    wrong = sum(bool(where.get(tid, set()) - {p}) for tid, p in eligible.items())
    ids_before = {d.tracker_id for d in last_before.detections if d.tracker_id > 0}
    ids_after = {d.tracker_id for r in after for d in r.detections if d.tracker_id > 0}
    return Continuity(
        len(before), len(eligible), kept, wrong, len(ids_before & ids_after), len(ids_before)
    )


def clip_gt(clip: Path) -> GroundTruth:
    return load_gt(clip.parent / "gt" / "gt.txt")
