"""Frames out at the rate of their PTS (a file played like a live camera)."""

from __future__ import annotations

import threading
import time


class FramePacer:
    """Sleeps so frames come out at the rate of their PTS."""

    def __init__(self) -> None:
        self._origin: tuple[float, float] | None = None  # (pts seconds, monotonic)

    def wait(self, t: float, stop: threading.Event) -> None:
        now = time.monotonic()
        if self._origin is None or t < self._origin[0]:
            self._origin = (t, now)
            return
        due = self._origin[1] + (t - self._origin[0])
        if due - now > 5.0:  # a forward PTS jump: re-anchor instead of stalling
            self._origin = (t, now)
        elif due > now:
            stop.wait(due - now)
