"""Per-stream credit window: at most N frames of a stream in flight (sans-I/O).

The sender asks ``can_send``; ``sent`` takes a credit, ``completed`` (a result
or an error for that frame came back) returns it.

Credits cover the *network*, not the worker::

    N = 1 + ceil(fps x network_rtt)        clamped to [1, cap]

where ``network_rtt`` is the frame's round trip minus the time it spent inside
the worker (which the worker reports). One frame is being processed while the
next ``fps x network_rtt`` frames are on the wire, so a stream reaches its
target rate whenever the worker keeps up. When the worker is overloaded,
slower processing does *not* earn a stream more credits: more frames in flight
would only make queues and batches longer, so latency would climb instead of
the excess turning into counted drops (newest frame wins at the sender).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_NOISE = 0.05  # fraction of a frame interval ignored as measurement noise


@dataclass(slots=True)
class CreditWindow:
    """Credits of one stream. Pure state: the caller supplies the clock."""

    cap: int = 4
    limit: int = 1
    net_rtt_s: float | None = None
    alpha: float = 0.2
    inflight: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"credit cap must be >= 1, got {self.cap}")
        self.limit = max(1, min(self.limit, self.cap))

    @property
    def available(self) -> int:
        return max(0, self.limit - len(self.inflight))

    def can_send(self) -> bool:
        return self.available > 0

    def sent(self, seq: int, now: float) -> None:
        """Record that frame ``seq`` left; the caller must check ``can_send``."""
        if not self.can_send():
            raise RuntimeError(
                f"no credit to send frame {seq} ({len(self.inflight)}/{self.limit} in flight)"
            )
        self.inflight[seq] = now

    def completed(self, seq: int, now: float, worker_s: float | None = None) -> float | None:
        """Frame ``seq`` came back; returns its round trip, or None if unknown.

        ``worker_s``: the time the worker says the frame spent inside it; the
        rest of the round trip is the network, which sizes the window.
        """
        sent_at = self.inflight.pop(seq, None)
        if sent_at is None:
            return None
        rtt = max(0.0, now - sent_at)
        if worker_s is not None:
            net = max(0.0, rtt - worker_s)
            prev = self.net_rtt_s
            self.net_rtt_s = net if prev is None else prev + self.alpha * (net - prev)
        return rtt

    def resize(self, fps: float) -> int:
        """Set ``limit = 1 + ceil(fps x network_rtt)`` within [1, cap]; returns it."""
        if fps > 0 and self.net_rtt_s is not None:
            extra = max(0, math.ceil(fps * self.net_rtt_s - _NOISE))
            self.limit = max(1, min(self.cap, 1 + extra))
        return self.limit

    def expire(self, now: float, timeout_s: float) -> list[int]:
        """Give up on frames in flight longer than ``timeout_s``; returns their seqs."""
        late = [s for s, t in self.inflight.items() if now - t > timeout_s]
        for s in late:
            del self.inflight[s]
        return late

    def abandon(self) -> int:
        """The connection is gone: forget every frame in flight."""
        n = len(self.inflight)
        self.inflight.clear()
        return n
