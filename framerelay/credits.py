"""Per-stream credit window: at most N frames of a stream in flight (sans-I/O).

The sender asks ``can_send``; ``sent`` takes a credit, ``completed`` (a result
or an error for that frame came back) returns it. The window follows::

    N = ceil(fps x own_round_trip - slack)        clamped to [1, cap]

where ``own_round_trip`` is the frame's round trip minus the time it spent
waiting for *other* frames at the worker (its queue wait, and the share of a
batched inference that belongs to its batch-mates), as the worker reports. So
N covers the network and the frame's own processing: a stream reaches its
target rate whenever the worker keeps up, across any RTT. When the worker is
overloaded, waiting behind other streams does *not* earn a stream more
credits: more frames in flight would only make queues and batches longer, so
latency would climb instead of the excess turning into counted drops (the
newest frame wins at the sender). ``slack`` (a tenth of a frame interval)
keeps measurement noise on loopback from doubling the window.

The window also never *grows* while the worker is the bottleneck: when the
stream's frames wait at the worker (smoothed) longer than a frame interval
(and at least ``BUSY_FLOOR_S``), more frames in flight could only queue there.
This matters where the frame's own round trip is inflated by CPU contention
rather than by the network (ingest and worker sharing cores): without it a
stream's window flips from 1 to 2 and every overloaded stream's latency
doubles. It shrinks as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SLACK = 0.1
BUSY_FLOOR_S = 0.05


@dataclass(slots=True)
class CreditWindow:
    """Credits of one stream. Pure state: the caller supplies the clock."""

    cap: int = 4
    limit: int = 1
    own_rtt_s: float | None = None
    waited_s: float | None = None
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
        return len(self.inflight) < self.limit

    def take(self, seq: int, now: float) -> bool:
        """Take a credit for frame ``seq`` sent at ``now`` if one is free; False (and
        nothing taken) if not. :meth:`can_send` and :meth:`sent` in one step."""
        if len(self.inflight) >= self.limit:
            return False
        self.inflight[seq] = now
        return True

    def sent(self, seq: int, now: float) -> None:
        """Record that frame ``seq`` left; the caller must check ``can_send``."""
        if not self.can_send():
            raise RuntimeError(
                f"no credit to send frame {seq} ({len(self.inflight)}/{self.limit} in flight)"
            )
        self.inflight[seq] = now

    def completed(self, seq: int, now: float, waited_s: float | None = None) -> float | None:
        """Frame ``seq`` came back; returns its round trip, or None if unknown.

        ``waited_s``: how long the worker says the frame waited for other
        frames (queue + batch-mates); the rest of the round trip sizes the
        window. ``None`` (an error reply, no timings) leaves the estimate alone.
        """
        sent_at = self.inflight.pop(seq, None)
        if sent_at is None:
            return None
        rtt = max(0.0, now - sent_at)
        if waited_s is not None:
            own = max(0.0, rtt - waited_s)
            self.own_rtt_s = self._smooth(self.own_rtt_s, own)
            self.waited_s = self._smooth(self.waited_s, waited_s)
        return rtt

    def _smooth(self, prev: float | None, value: float) -> float:
        return value if prev is None else prev + self.alpha * (value - prev)

    def worker_busy(self, fps: float) -> bool:
        """Frames wait at the worker longer than a frame interval: it is the bottleneck."""
        return self.waited_s is not None and self.waited_s > max(1.0 / fps, BUSY_FLOOR_S)

    def resize(self, fps: float) -> int:
        """Set ``limit = ceil(fps x own_rtt - slack)`` within [1, cap], not above the current
        limit while the worker is busy; returns it."""
        if fps > 0 and self.own_rtt_s is not None:
            wanted = math.ceil(fps * self.own_rtt_s - SLACK)
            if wanted > self.limit and self.worker_busy(fps):
                wanted = self.limit
            self.limit = max(1, min(self.cap, wanted))
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


def waited_s(timings: dict[str, float]) -> float:
    """From a result's timings: how long the frame waited for other frames at the
    worker (its queue wait, and its batch-mates' share of a batched inference)."""
    batch = max(timings.get("batch", 1.0), 1.0)
    infer = timings.get("infer_ms", 0.0)
    return (timings.get("queue_ms", 0.0) + infer * (batch - 1) / batch) / 1000
