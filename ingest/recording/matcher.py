"""Place results on recorded frames: which segment, which frame.

The ingest and the recorder each read the camera. Where the camera's
timestamps are shared by its readers (MPEG-TS over HTTP/UDP, HLS, files) a
result's PTS is exactly the PTS of a recorded frame: that is the match
(``exact``). Epochs differ between the two (each counts its own reconnects),
so the wall clock picks the recorder epoch: the one that was recording within
``window_s`` of the result's ``captured_at``. Where no frame has the result's
PTS (readers with their own timestamp origin, e.g. separate RTSP sessions), the
frame nearest in wall-clock time within ``NEAREST_S`` gives a PTS offset; once
one offset has most votes for a pair of (ingest, recorder) epochs, results are
placed with it, so clock jitter cannot move them a frame (``exact`` false) -
but only as long as no result ever matched exactly: once timestamps
are known to be shared, a result without its frame (recorded while the
recorder was down, or lost in a crash) goes to a gap file rather than onto a
neighbouring frame. A result whose time was not recorded at all goes to a gap
file too.

A recorder epoch's wall clock is modelled as ``origin + pts x time_base`` with
``origin`` the least-delayed arrival seen, so frames that came in a burst
(after a probe, a stall) still get their true times.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass, field
from fractions import Fraction

from framerelay.results import ResultRecord
from ingest.recording.segmenter import FrameEvent

NEAREST_S = 0.5
LOCK_VOTES = 5  # an offset needs this many votes ...
LOCK_LEAD = 1.5  # ... and this many times the runner-up's


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a result goes: a segment and its frame, or a gap (``segment`` None)."""

    segment: str | None
    seg_pts: int | None
    time_base: tuple[int, int] | None
    exact: bool


GAP = Placement(None, None, None, False)


@dataclass(slots=True)
class _Epoch:
    number: int
    tb: Fraction
    wrap: int
    origin: float = float("inf")
    pts: list[int] = field(default_factory=list)
    frames: dict[int, tuple[int, str, int]] = field(default_factory=dict)  # key -> pts, seg, rel

    def add(self, pts: int, wall: float | None, segment: str, seg_pts: int) -> None:
        if wall is not None:
            self.origin = min(self.origin, wall - float(pts * self.tb))
        key = pts % self.wrap if self.wrap else pts
        if key not in self.frames:
            bisect.insort(self.pts, pts)
        self.frames[key] = (pts, segment, seg_pts)

    def wall(self, pts: int) -> float:
        return self.origin + float(pts * self.tb)

    def drop_before(self, t: float) -> None:
        cut = bisect.bisect_left(self.pts, (t - self.origin) / float(self.tb))
        for pts in self.pts[:cut]:
            self.frames.pop(pts % self.wrap if self.wrap else pts, None)
        del self.pts[:cut]

    def covers(self, t: float, margin: float) -> bool:
        return bool(self.pts) and self.wall(self.pts[0]) - margin <= t <= (
            self.wall(self.pts[-1]) + margin
        )

    def ticks(self, record: ResultRecord) -> Fraction:
        """The result's PTS in this epoch's time base (exact where it can be)."""
        return record.pts * Fraction(*record.time_base) / self.tb

    def at(self, pts: int) -> tuple[int, str, int] | None:
        return self.frames.get(pts % self.wrap if self.wrap else pts)

    def exact(self, record: ResultRecord) -> tuple[int, str, int] | None:
        ticks = self.ticks(record)
        return self.at(int(ticks)) if ticks.denominator == 1 else None

    def nearest(self, t: float, within: float) -> tuple[int, str, int] | None:
        target = (t - self.origin) / float(self.tb)
        i = bisect.bisect_left(self.pts, target)
        best = min((self.pts[j] for j in (i - 1, i) if 0 <= j < len(self.pts)),
                   key=lambda p: abs(p - target), default=None)  # fmt: skip
        if best is None or abs(self.wall(best) - t) > within:
            return None
        key = best % self.wrap if self.wrap else best
        return self.frames[key]


class FrameLog:
    """Recently recorded frames per recorder epoch, bounded by ``horizon_s``."""

    def __init__(self, window_s: float = 10.0, horizon_s: float = 900.0) -> None:
        self.window_s = window_s
        self.horizon_s = horizon_s
        self._epochs: dict[int, _Epoch] = {}
        self.latest_wall = 0.0
        self.exact_hits = 0
        self._votes: dict[tuple[int, int], collections.Counter[int]] = {}

    def open_epoch(self, epoch: int, tb: Fraction, wrap_bits: int | None) -> None:
        if epoch not in self._epochs:
            self._epochs[epoch] = _Epoch(epoch, tb, 1 << wrap_bits if wrap_bits else 0)

    def add(self, ev: FrameEvent) -> None:
        self._epochs[ev.epoch].add(ev.pts, ev.wall, ev.segment, ev.seg_pts)
        self.latest_wall = max(self.latest_wall, ev.wall)

    def add_recorded(
        self, epoch: int, start_pts: int, start_wall: float, rel_pts: list[int], segment: str
    ) -> None:
        """Frames of a segment already on disk (after a restart)."""
        ep = self._epochs[epoch]
        ep.origin = min(ep.origin, start_wall - float(start_pts * ep.tb))
        for rel in rel_pts:
            ep.add(start_pts + rel, None, segment, rel)

    def place(self, record: ResultRecord, now: float, *, final: bool = False) -> Placement | None:
        """Where ``record`` goes, or None while its frame may still be recorded.

        ``now`` is the wall clock: a frame arrives within ``window_s`` of its capture
        time or never (``final``: decide now, the recording has stopped).
        """
        t = record.captured_at
        near = [e for e in self._epochs.values() if e.covers(t, self.window_s)]
        near.sort(key=lambda e: abs(e.wall(e.pts[len(e.pts) // 2]) - t))
        for ep in near:
            hit = ep.exact(record)
            if hit is not None and abs(ep.wall(hit[0]) - t) <= self.window_s:
                self.exact_hits += 1
                return Placement(hit[1], hit[2], _tb(ep.tb), True)
        if not final and now < t + self.window_s:
            return None  # the frame may still come
        for ep in near if not self.exact_hits else ():
            hit = self._by_offset(ep, record)
            if hit is not None:
                return Placement(hit[1], hit[2], _tb(ep.tb), False)
        return GAP

    def _by_offset(self, ep: _Epoch, record: ResultRecord) -> tuple[int, str, int] | None:
        """Unshared timestamps: each result votes for the PTS offset its nearest frame (by
        wall clock) implies; once one offset clearly wins for this pair of epochs, every
        result is placed with it, so jitter in the clocks cannot move it a frame."""
        hit = ep.nearest(record.captured_at, NEAREST_S)
        if hit is None:
            return None
        ticks = round(ep.ticks(record))
        votes = self._votes.setdefault((record.epoch, ep.number), collections.Counter())
        votes[hit[0] - ticks] += 1
        (offset, n), *rest = votes.most_common(2)
        if n >= LOCK_VOTES and n >= LOCK_LEAD * (rest[0][1] if rest else 0):
            return ep.at(ticks + offset) or hit
        return hit

    def prune(self, now: float) -> None:
        """Forget frames older than the horizon (and epochs left empty)."""
        for epoch, ep in list(self._epochs.items()):
            if ep.pts:
                ep.drop_before(now - self.horizon_s)
                if not ep.pts:
                    del self._epochs[epoch]


def _tb(tb: Fraction) -> tuple[int, int]:
    return tb.numerator, tb.denominator
