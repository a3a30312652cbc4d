"""Per-tunnel budgets: how much damage one tunnel may do before it is slowed or cut.

A correct ingest never sends an invalid FRAME header or an undecodable image;
:class:`ErrorBudget` counts those per second and the tunnel is closed (1008)
past the limit. Refused frames (unknown stream, credit exceeded, a full lane,
and the bad ones) cost the event loop a parse and a reply each; a tunnel that
causes more than :class:`Pacer`'s rate is read more slowly (the receive loop
sleeps, so TCP pushes back on the sender), which keeps its cost off the other
tunnels without closing it.
"""

from __future__ import annotations


class ErrorBudget:
    """At most ``limit`` events per one-second window (0: no limit)."""

    def __init__(self, limit: int, window_s: float = 1.0) -> None:
        self.limit = limit
        self.window_s = window_s
        self._start = 0.0
        self.count = 0

    def spend(self, now: float) -> bool:
        """Count one event; False once the window holds more than ``limit``."""
        if now - self._start >= self.window_s:
            self._start, self.count = now, 0
        self.count += 1
        return not self.limit or self.count <= self.limit


class Pacer:
    """A token bucket of ``rate`` events per second, with a burst of ``burst_s`` worth.

    ``spend`` takes a token per event; ``delay`` says how long the caller should
    wait before its next event so that it stays within ``rate`` (0: no limit).
    The burst is short so that even a flood's first burst stays brief.
    """

    def __init__(self, rate: float, burst_s: float = 0.05) -> None:
        self.rate = rate
        self.burst = max(1.0, rate * burst_s)
        self._tokens = self.burst
        self._at: float | None = None

    def _refill(self, now: float) -> None:
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def spend(self, now: float) -> None:
        if self.rate > 0:
            self._refill(now)
            self._tokens -= 1

    def delay(self, now: float) -> float:
        if self.rate <= 0:
            return 0.0
        self._refill(now)
        return max(0.0, -self._tokens / self.rate)
