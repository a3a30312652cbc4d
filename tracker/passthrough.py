"""``none``: a tracker that assigns no ids (detection-only streams)."""

from __future__ import annotations

import struct

from framerelay.detections import Detections
from tracker.base import register_tracker
from tracker.snapshot import SnapshotError, decode, encode

_LEGACY_MAGIC = b"FRTN"
_LEGACY = _LEGACY_MAGIC + struct.pack("<H", 1)


@register_tracker("none")
class PassthroughTracker:
    """Returns detections unchanged, with ``tracker_id`` -1."""

    name = "none"

    def update(self, detections: Detections, t: float) -> Detections:
        return detections

    def reset(self) -> None:
        return None

    def snapshot(self) -> bytes:
        return encode(self.name, "{}", {})

    @classmethod
    def restore(cls, data: bytes) -> PassthroughTracker:
        if bytes(data) == _LEGACY:
            return cls()
        snap = decode(data)
        if snap.name != cls.name:
            raise SnapshotError(
                f"snapshot holds a {snap.name!r} tracker, not 'none'; "
                "restore it with tracker.restore_tracker(data)"
            )
        return cls()
