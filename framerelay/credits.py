"""Per-stream credit window: at most N frames of a stream in flight (sans-I/O).

The sender asks ``can_send``; ``sent`` takes a credit, ``completed`` (a result
or an error for that frame came back) returns it. The window size follows
``N = ceil(fps x round-trip)`` where the round trip excludes time the frame
waited in the worker's queue (so an overloaded worker does not make the sender
put *more* frames in flight), clamped to ``[1, cap]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class CreditWindow:
    """Credits of one stream. Pure state: the caller supplies the clock."""

    cap: int = 4
    limit: int = 1
    rtt_ewma_s: float | None = None
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

    def completed(self, seq: int, now: float, queued_s: float = 0.0) -> float | None:
        """Frame ``seq`` came back; returns its round trip, or None if unknown."""
        sent_at = self.inflight.pop(seq, None)
        if sent_at is None:
            return None
        rtt = max(0.0, now - sent_at)
        service = max(0.0, rtt - queued_s)
        prev = self.rtt_ewma_s
        self.rtt_ewma_s = service if prev is None else prev + self.alpha * (service - prev)
        return rtt

    def resize(self, fps: float) -> int:
        """Set ``limit = ceil(fps x rtt)`` clamped to [1, cap]; returns it."""
        if fps > 0 and self.rtt_ewma_s is not None:
            self.limit = max(1, min(self.cap, math.ceil(fps * self.rtt_ewma_s)))
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
