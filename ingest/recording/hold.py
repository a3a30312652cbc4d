"""Which boxes a clip frame shows: results held between the frames they were computed on.

Results usually come at a lower rate than the video (5 fps sampling of a 25 fps
camera): drawing each result only on its own frame makes the boxes flicker. A
track's box is held from its latest result until the next result that has that
track, or until it is stale (older than ``hold_s``: the track was lost or the
results stopped). Untracked boxes (``tracker_id`` -1) have no identity to follow:
they are held until the next result of any kind, or until stale. With
``hold_s`` 0 every box shows on its own frame only.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence

from framerelay.results import DetectionOut

HOLD_INTERVALS = 2.0
"""A box is stale after this many result intervals."""
DEFAULT_HOLD_S = 0.4
"""When the interval cannot be measured (fewer than two results): 2 x 0.2 s (5 fps)."""
MAX_HOLD_S = 5.0


def default_hold_s(result_times: Iterable[float]) -> float:
    """``HOLD_INTERVALS`` x the median interval between results (seconds), capped."""
    times = sorted(set(result_times))
    steps = [b - a for a, b in itertools.pairwise(times) if b > a]
    if not steps:
        return DEFAULT_HOLD_S
    return min(MAX_HOLD_S, HOLD_INTERVALS * statistics.median(steps))


class BoxHold:
    """Boxes to draw at a time ``t`` (seconds, increasing), given results as they come."""

    def __init__(self, hold_s: float) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s}")
        self.hold_s = hold_s
        self._tracks: dict[int, tuple[float, DetectionOut]] = {}
        self._untracked: tuple[float, tuple[DetectionOut, ...]] = (0.0, ())

    def result(self, t: float, detections: Sequence[DetectionOut]) -> None:
        """A result computed on the frame at ``t``."""
        for det in detections:
            if det.tracker_id >= 0:
                self._tracks[det.tracker_id] = (t, det)
        self._untracked = (t, tuple(d for d in detections if d.tracker_id < 0))

    def at(self, t: float) -> list[DetectionOut]:
        """The boxes of the frame at ``t``: fresh and held ones, stale ones forgotten."""
        for tid in [k for k, (seen, _) in self._tracks.items() if t - seen > self.hold_s]:
            del self._tracks[tid]
        boxes = [det for _, det in self._tracks.values()]
        seen, untracked = self._untracked
        if t - seen <= self.hold_s:
            boxes.extend(untracked)
        return boxes

    def reset(self) -> None:
        """A discontinuity (a new recorder epoch): nothing carries over."""
        self._tracks.clear()
        self._untracked = (0.0, ())
