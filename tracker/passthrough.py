"""``none``: a tracker that assigns no ids (detection-only streams)."""

from __future__ import annotations

import struct

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from tracker.base import register_tracker

_MAGIC = b"FRTN"
_VERSION = 1


@register_tracker("none")
class PassthroughTracker:
    """Returns detections unchanged, with ``tracker_id`` -1."""

    name = "none"

    def update(self, detections: Detections, t: float) -> Detections:
        return detections

    def reset(self) -> None:
        return None

    def snapshot(self) -> bytes:
        return _MAGIC + struct.pack("<H", _VERSION)

    @classmethod
    def restore(cls, data: bytes) -> PassthroughTracker:
        if data[:4] != _MAGIC or len(data) != 6:
            raise ConfigError("not a 'none' tracker snapshot")
        return cls()
