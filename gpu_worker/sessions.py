"""Per-stream sessions: one tracker per stream, on a continuous clock.

A session is created by the stream's OPEN and freed by its CLOSE (or when the
tunnel closes). Its tracker is fed the frame's PTS time; when the epoch
changes (reconnect, PTS reset) the tracker clock continues from where it was,
advanced by the gap measured on the ingest clock (``captured_at``), so ids
survive a short reconnect and time never runs backwards for the tracker.

Every ``snapshot_interval_s`` (of stream time), and after every frame that reports a
track id the last snapshot did not know, the session emits a snapshot (tracker state +
clock) that the ingest keeps; an OPEN carrying it resumes the
session on any worker, so track ids continue when a stream is re-homed. The
time from the snapshot to the first frame on the new worker is an outage: the
first frame's tracker time is handed to the tracker's ``bridge`` first
(:mod:`tracker.gap`), so tracks are predicted over the gap instead of being
dropped for the seconds nobody looked (up to the tracker's ``max_gap_s``).

An OPEN may carry the stream's own tracker time settings
(:class:`framerelay.wire.TrackerTimes`): they apply to a new tracker and, on
resume, replace those in the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from framerelay import wire
from framerelay.detections import Detections
from framerelay.errors import ConfigError
from framerelay.wire import Frame, SessionClock, TrackerTimes
from gpu_worker.model_pool import ServedModel
from tracker import Tracker, create_tracker, restore_tracker
from tracker.gap import GapBridging

_MIN_STEP_S = 1e-3


@dataclass(slots=True)
class StreamSession:
    stream_id: str
    tracker: Tracker
    min_confidence: float
    snapshot_interval_s: float = 0.0
    frames: int = 0
    _epoch: int | None = None
    _offset: float = 0.0
    _last_t: float = field(default=-1e18)
    _last_captured: float = 0.0
    _next_snapshot_t: float | None = None
    _bridge_next: bool = False
    """Resumed from a snapshot: the first frame's time ends an outage."""
    _snapped_id: int = -1
    """The highest track id reported up to the last snapshot: a higher one is a new track,
    whose id a session resumed from that snapshot would hand out again to someone else."""
    model: ServedModel | None = None
    """The model its frames go to (None: the batcher's own detector)."""

    @property
    def clock(self) -> SessionClock:
        return wire.build(
            SessionClock,
            epoch=self._epoch,
            offset=self._offset,
            last_t=self._last_t,
            last_captured=self._last_captured,
        )

    def resume(self, clock: SessionClock) -> None:
        self._epoch, self._offset = clock.epoch, clock.offset
        self._last_t, self._last_captured = clock.last_t, clock.last_captured
        self._bridge_next = True

    def tracker_time(self, frame: Frame) -> float:
        """Seconds on the session's continuous clock for this frame."""
        pts_t = frame.pts_time
        if self._epoch is None:
            self._epoch = frame.epoch
        elif frame.epoch != self._epoch:
            gap = max(frame.captured_at - self._last_captured, _MIN_STEP_S)
            self._offset = self._last_t + gap - pts_t
            self._epoch = frame.epoch
        t = max(pts_t + self._offset, self._last_t + _MIN_STEP_S)
        self._last_t, self._last_captured = t, frame.captured_at
        return t

    def track(self, frame: Frame, detections: Detections) -> Detections:
        """Run the tracker and keep what is worth sending."""
        t = self.tracker_time(frame)
        if self._bridge_next:
            self._bridge_next = False
            if isinstance(self.tracker, GapBridging):
                self.tracker.bridge(t)
        tracked = self.tracker.update(detections, t)
        self.frames += 1
        keep = (tracked.tracker_id >= 0) | (tracked.confidence >= self.min_confidence)
        return tracked if bool(keep.all()) else tracked[np.flatnonzero(keep)]

    def reset(self) -> None:
        """Start afresh after the tracker failed on a frame: no tracks, a new clock."""
        self.tracker.reset()
        self._epoch, self._offset = None, 0.0
        self._last_t, self._last_captured = -1e18, 0.0
        self._next_snapshot_t = None
        self._bridge_next = False
        self._snapped_id = -1

    def snapshot_due(self, tracked: Detections | None = None) -> bool:
        """True (and re-armed) when a snapshot should follow the last frame (``tracked``, its
        results): its interval is up, or it reports a track id newer than the last snapshot
        (a new track: a takeover from an older snapshot would give its id to another)."""
        if self.snapshot_interval_s <= 0:
            return False
        ids = tracked.tracker_id if tracked is not None else None
        newest = int(ids.max()) if ids is not None and len(ids) else -1
        # _MIN_STEP_S of slack: an interval of one frame period must not skip every other
        # frame because 0.4 + 0.2 > 15/25 in floating point
        due_t = self._next_snapshot_t
        timely = due_t is not None and self._last_t < due_t - _MIN_STEP_S
        if timely and newest <= self._snapped_id:
            return False
        self._next_snapshot_t = self._last_t + self.snapshot_interval_s
        self._snapped_id = max(self._snapped_id, newest)
        return True


def time_overrides(times: TrackerTimes | None) -> dict[str, Any]:
    """The settings an OPEN's ``tracker_settings`` sets (those left out keep the tracker's)."""
    if times is None:
        return {}
    return {k: v for k, v in msgspec.structs.asdict(times).items() if v is not None}


def _configured(tracker: Tracker, overrides: dict[str, Any]) -> Tracker:
    """``tracker`` with ``overrides`` applied; ConfigError for a tracker without them."""
    if not overrides:
        return tracker
    configure = getattr(tracker, "configure", None)
    if configure is None:
        raise ConfigError(f"tracker {tracker.name!r} has no time settings to set per stream")
    configure(**overrides)
    return tracker


def new_session(
    stream_id: str,
    tracker_name: str,
    min_confidence: float,
    snapshot_interval_s: float = 0.0,
    times: TrackerTimes | None = None,
) -> StreamSession:
    """Raises ConfigError for an unknown tracker name or a bad setting."""
    tracker = _configured(create_tracker(tracker_name), time_overrides(times))
    return StreamSession(stream_id, tracker, min_confidence, snapshot_interval_s)


def resumed_session(
    stream_id: str,
    blob: bytes,
    clock: SessionClock,
    min_confidence: float,
    snapshot_interval_s: float = 0.0,
    times: TrackerTimes | None = None,
) -> StreamSession:
    """A session continuing from a snapshot. Raises ConfigError for a bad one."""
    tracker = _configured(restore_tracker(blob), time_overrides(times))
    session = StreamSession(stream_id, tracker, min_confidence, snapshot_interval_s)
    session.resume(clock)
    return session
