"""Pure multi-object tracking: no I/O, numpy only.

Trackers follow the contract in :mod:`tracker.base` and are created by name::

    from tracker import create_tracker
    trk = create_tracker("none")
"""

from tracker.base import Tracker, available_trackers, create_tracker, register_tracker
from tracker.passthrough import PassthroughTracker

__all__ = [
    "PassthroughTracker",
    "Tracker",
    "available_trackers",
    "create_tracker",
    "register_tracker",
]
