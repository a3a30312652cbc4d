"""Live sources: keep decoding from falling behind the camera (see :class:`Catchup`)."""

from __future__ import annotations

import time
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from av.packet import Packet
    from av.video.stream import VideoStream


class Catchup:
    """Keeps a live source from falling behind: skip non-key frames while decoding lags.

    The lag is how much later than the earliest arrival seen a packet arrives,
    measured against its PTS: ``(now - pts) - min(now - pts)``. The reference
    creeps forward by ``DRIFT`` seconds per second so that clock drift between
    camera and ingest is not taken for lag. Above ``HIGH_S`` only key frames
    are decoded (the other packets are dropped undecoded, counted ``behind``);
    below ``LOW_S`` decoding resumes at the next key frame, so no frame is
    decoded from a missing reference.
    """

    HIGH_S = 1.0
    LOW_S = 0.25
    DRIFT = 1e-3

    def __init__(self, tb: Fraction) -> None:
        self._tb = tb
        self._ref: float | None = None
        self._at = 0.0
        self.lag_s = 0.0
        self.skipping = False

    def skips(self, packet: Packet[VideoStream]) -> bool:
        """Track the lag with this packet; True if it is to be dropped undecoded."""
        if packet.pts is not None:
            now = time.monotonic()
            offset = now - float(packet.pts * self._tb)
            ref = self._ref
            if ref is None or offset < ref:
                ref = offset
            else:
                ref = min(offset, ref + self.DRIFT * (now - self._at))
            self._ref, self._at = ref, now
            self.lag_s = offset - ref
        if not self.skipping and self.lag_s > self.HIGH_S:
            self.skipping = True
        elif self.skipping and packet.is_keyframe and self.lag_s < self.LOW_S:
            self.skipping = False
        return self.skipping and not packet.is_keyframe
