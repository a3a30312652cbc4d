"""Is the worker behind a tunnel still answering? The decision, without I/O.

The tunnel client (:mod:`ingest.tunnel_client`) sends a WebSocket ping every
``heartbeat_interval_s`` (one outstanding at a time) and tells
:class:`TunnelHealth` what comes back - pongs (:meth:`TunnelHealth.pong`),
results and errors for frames (:meth:`TunnelHealth.result`) - and asks
:meth:`TunnelHealth.check` with the send time of the oldest frame in flight.

The threshold ``T`` follows the streams and the link::

    T = max(stall_after_s, 3 x rtt_p95 + 2 / min_fps)

``rtt_p95``: the 95th percentile of the last 64 round trips (heartbeat pongs
and frames) measured while the tunnel was healthy; ``min_fps``: the lowest
sampling rate of the tunnel's streams (the term is left out when none is
known). The tunnel is ``STALLED`` when either

* **silent**: no sign of life for ``T`` - neither a pong (a pong dates the
  worker's life to its ping's send time) nor a result - e.g. a frozen
  process (SIGSTOP), a dead host, a black-holed network; or
* **no results**: frames are in flight, the oldest sent more than ``T``
  ago, and no result came for ``T`` - the worker answers heartbeats but not
  frames (hung inference).

It is healthy again once a pong or result arrives after the stall began
(silent), or a result (no results). A tunnel still stalled ``T`` after the
stall began (``2 T`` after the last sign of life) should be closed and
reconnected (:attr:`Verdict.reconnect`).
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass

import numpy as np

RTT_WINDOW = 64
MIN_SLEEP_S = 0.01


class TunnelState(enum.StrEnum):
    IDLE = "IDLE"
    """No stream ever asked for this tunnel, or the client was stopped."""
    CONNECTING = "CONNECTING"
    UP = "UP"
    STALLED = "STALLED"
    """Connected, but the worker stopped answering (see the module doc)."""
    DOWN = "DOWN"
    """The connection was lost or refused; waiting out the backoff."""


class Cause(enum.StrEnum):
    SILENT = "silent"
    NO_RESULTS = "no_results"


@dataclass(frozen=True, slots=True)
class Verdict:
    stalled: bool
    reason: str | None
    changed: bool
    """``stalled`` differs from the previous verdict."""
    reconnect: bool = False
    """Stalled for another threshold: close the tunnel and connect again."""


class TunnelHealth:
    """Heartbeat and result bookkeeping of one tunnel; the caller supplies the clock."""

    def __init__(self, stall_after_s: float) -> None:
        if not 0 < stall_after_s < float("inf"):
            raise ValueError(f"stall_after_s must be positive and finite, got {stall_after_s}")
        self.stall_after_s = stall_after_s
        self.rtts: collections.deque[float] = collections.deque(maxlen=RTT_WINDOW)
        self.stalls = 0
        """Times this tunnel went STALLED (all sessions)."""
        self.reset(0.0)

    def reset(self, now: float) -> None:
        """A session starts (its HELLO arrived): everything counts from ``now``."""
        self.alive_at = now
        """The latest time the worker is known to have been alive."""
        self.heard_at = now
        """Arrival of the last pong or result."""
        self.result_at = now
        self.pong_at: float | None = None
        self.stalled_since: float | None = None
        self.cause: Cause | None = None
        self.reason: str | None = None

    @property
    def stalled(self) -> bool:
        return self.stalled_since is not None

    def pong(self, sent_at: float, now: float) -> None:
        """The pong to a ping sent at ``sent_at`` arrived."""
        self.alive_at = max(self.alive_at, sent_at)
        self.heard_at = self.pong_at = now
        if not self.stalled:  # a pong held up by the stall measures the stall, not the link
            self.rtts.append(max(0.0, now - sent_at))

    def result(self, now: float, rtt: float | None = None) -> None:
        """A result (or an error) for a frame arrived; ``rtt``: that frame's round trip."""
        self.alive_at = self.heard_at = self.result_at = now
        if rtt is not None and not self.stalled:
            self.rtts.append(rtt)

    def rtt_p95(self) -> float | None:
        if not self.rtts:
            return None
        return float(np.percentile(np.fromiter(self.rtts, dtype=np.float64), 95))

    def threshold(self, min_fps: float | None) -> float:
        """``max(stall_after_s, 3 x rtt_p95 + 2 / min_fps)`` (see the module doc)."""
        rtt = self.rtt_p95() or 0.0
        per_frame = 2.0 / min_fps if min_fps else 0.0
        return max(self.stall_after_s, 3.0 * rtt + per_frame)

    def next_check_in(self, now: float, min_fps: float | None) -> float:
        """Seconds until the silent condition could first hold (to check just then)."""
        return max(MIN_SLEEP_S, self.alive_at + self.threshold(min_fps) - now)

    def check(self, now: float, oldest_inflight: float | None, min_fps: float | None) -> Verdict:
        """The state now; ``oldest_inflight``: send time of the oldest unanswered frame."""
        limit = self.threshold(min_fps)
        was = self.stalled_since
        if was is not None and not self._recovered(was):
            return Verdict(True, self.reason, False, reconnect=now - was > limit)
        # once heard from after a stall, the worker is alive now, whatever its pong dates
        alive = self.alive_at if was is None else max(self.alive_at, self.heard_at)
        found = self._cause(now, alive, oldest_inflight, limit)
        if found is None:
            self.stalled_since = self.cause = self.reason = None
            return Verdict(False, None, changed=was is not None)
        self.cause, self.reason = found
        if was is None:
            self.stalled_since = now
            self.stalls += 1
        since = self.stalled_since
        assert since is not None  # noqa: S101 - set just above
        return Verdict(True, self.reason, changed=was is None, reconnect=now - since > limit)

    def _recovered(self, since: float) -> bool:
        if self.cause is Cause.SILENT:
            return self.heard_at > since
        return self.result_at > since

    def _cause(
        self, now: float, alive: float, oldest_inflight: float | None, limit: float
    ) -> tuple[Cause, str] | None:
        silent = now - alive
        if silent > limit:
            return Cause.SILENT, (
                f"the worker sent no heartbeat or result for {silent:.1f} s "
                f"(threshold {limit:.1f} s)"
            )
        if oldest_inflight is not None:
            waiting = now - max(oldest_inflight, self.result_at)
            if waiting > limit:
                return Cause.NO_RESULTS, (
                    f"frames in flight and no result for {waiting:.1f} s "
                    f"(threshold {limit:.1f} s); the worker still answers heartbeats"
                )
        return None
