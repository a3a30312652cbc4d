"""Pure multi-object tracking: no I/O, numpy only.

Trackers follow the contract in :mod:`tracker.base` and are created by name::

    from tracker import create_tracker, restore_tracker
    trk = create_tracker("default")          # hybrid ByteTrack + OC-SORT
    out = trk.update(detections, t=pts_seconds)
    blob = trk.snapshot()
    same = restore_tracker(blob)             # in any process
"""

from tracker.base import (
    Tracker,
    available_trackers,
    create_tracker,
    register_tracker,
    restore_tracker,
)
from tracker.bytetrack import ByteTrackTracker, HybridTracker, OCSortTracker
from tracker.passthrough import PassthroughTracker
from tracker.settings import ByteTrackSettings, HybridSettings, OCSortSettings, SortSettings
from tracker.snapshot import SnapshotError

__all__ = [
    "ByteTrackSettings",
    "ByteTrackTracker",
    "HybridSettings",
    "HybridTracker",
    "OCSortSettings",
    "OCSortTracker",
    "PassthroughTracker",
    "SnapshotError",
    "SortSettings",
    "Tracker",
    "available_trackers",
    "create_tracker",
    "register_tracker",
    "restore_tracker",
]
