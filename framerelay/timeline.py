"""Source time: PTS unwrapping, epochs, and sampling by PTS.

Every frame is identified by ``(stream_id, epoch, pts)``. ``pts`` is the
source's own timestamp in ``time_base`` units, unwrapped (MPEG-TS PTS wrap at
2^33); ``epoch`` increases on every discontinuity (reconnect, PTS going
backwards, or jumping forward by more than ``max_jump_s``), so that within one
epoch PTS only move forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

MPEGTS_WRAP_BITS = 33
_SLACK_S = 1e-3  # absorbs PTS rounding at the sampling boundary


@dataclass(slots=True)
class Timeline:
    """Stamps raw decoder PTS with ``(epoch, unwrapped_pts)``.

    ``wrap_bits``: width of the source's PTS counter (33 for MPEG-TS), or
    ``None`` when PTS never wrap (MP4, MKV). Frames without a PTS (the first
    RTSP frames often have none) cannot be placed in time: callers drop and
    count them rather than invent a timestamp.
    """

    time_base: Fraction
    wrap_bits: int | None = None
    max_jump_s: float = 10.0
    epoch: int = 0
    _offset: int = 0
    _last_raw: int | None = None
    _last_pts: int | None = None
    _pending_epoch: bool = field(default=False)

    def new_epoch(self) -> None:
        """Start a new epoch at the next frame (call on reconnect or loop)."""
        self._pending_epoch = True

    def stamp(self, raw_pts: int) -> tuple[int, int]:
        """Return ``(epoch, pts)`` for the next decoded frame."""
        self._bump_if_pending()
        pts = self._unwrap(raw_pts)
        last = self._last_pts
        if last is not None and self._is_discontinuity(pts - last):
            self._start_epoch()
            pts = raw_pts
            self._last_raw = raw_pts
        self._last_pts = pts
        return self.epoch, pts

    def seconds(self, pts: int) -> float:
        return float(pts * self.time_base)

    def _bump_if_pending(self) -> None:
        if self._pending_epoch:
            if self._last_pts is not None:
                self._start_epoch()
            self._pending_epoch = False

    def _start_epoch(self) -> None:
        self.epoch += 1
        self._offset = 0
        self._last_raw = None
        self._last_pts = None

    def _unwrap(self, raw: int) -> int:
        if self.wrap_bits is not None and self._last_raw is not None:
            span = 1 << self.wrap_bits
            if raw - self._last_raw < -(span >> 1):
                self._offset += span
            elif raw - self._last_raw > (span >> 1):
                self._offset -= span
        self._last_raw = raw
        return raw + self._offset

    def _is_discontinuity(self, delta: int) -> bool:
        return delta < 0 or float(delta * self.time_base) > self.max_jump_s


@dataclass(slots=True)
class Sampler:
    """Keeps frames at ``fps`` by PTS time (``fps <= 0`` keeps every frame)."""

    fps: float
    _next: float | None = None
    _epoch: int = -1

    def keep(self, epoch: int, t: float) -> bool:
        if self.fps <= 0:
            return True
        if epoch != self._epoch or self._next is None:
            self._epoch, self._next = epoch, t
        if t < self._next - _SLACK_S:
            return False
        period = 1.0 / self.fps
        self._next += period
        if self._next < t:  # after a gap, realign rather than burst
            self._next = t + period
        return True
