"""Source time: PTS unwrapping, epochs, the epoch budget, and sampling.

Every frame is identified by ``(stream_id, epoch, pts)``. ``pts`` is the
source's own timestamp in ``time_base`` units, unwrapped (MPEG-TS PTS wrap at
2^33); ``epoch`` increases on every discontinuity (reconnect, PTS going
backwards, or jumping forward by more than ``max_jump_s``), so that within one
epoch PTS only move forward.

Damaged timestamps can make every frame a discontinuity. An
:class:`EpochBudget` bounds the epochs a stream may start per window (60 s);
past it the :class:`Timeline` stops trusting PTS: further discontinuities are
counted (``corrupt``) instead of starting epochs, and frames are stamped in
decode order (one nominal frame duration after the previous one), so ``pts``
stays monotonic within the epoch. Once the discontinuities in the window fall
to half the budget, PTS are trusted again (a new epoch).

The :class:`Sampler` keeps frames at a target rate on a time that continues
across epochs (a storm of epochs cannot burst), and also on a clock that damaged
PTS cannot speed up: the wall clock for live sources, decode order
(:class:`FrameClock`) for files read as fast as possible (a token bucket at
``fps`` with a burst of one frame).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from fractions import Fraction

MPEGTS_WRAP_BITS = 33
DEFAULT_FPS = 25.0
"""Frame rate assumed for decode-order time when the source does not say."""
BUDGET_WINDOW_S = 60.0
_SLACK_S = 1e-3  # absorbs PTS rounding at the sampling boundary
_MAX_NOTED = 10_000  # discontinuities remembered per window (a bound on memory, not on the count)
_INTERVALS = 9  # PTS steps the frame clock takes the lower quartile of
_MAX_INTERVAL_S = 1.0  # a longer PTS step is a gap (or damage), not a frame interval


def frame_ticks(fps: float, time_base: Fraction) -> int:
    """One frame at ``fps`` (``DEFAULT_FPS`` if unknown or absurd) in ``time_base`` units."""
    rate = fps if 0 < fps <= 1000 else DEFAULT_FPS
    return max(1, round(1 / (Fraction(rate) * time_base)))


@dataclass(slots=True)
class EpochBudget:
    """At most ``max_epochs`` discontinuities per ``window_s`` may start an epoch.

    Time is the caller's clock (wall clock for live sources, decode-order
    seconds for files read as fast as possible). Every discontinuity is noted,
    whether it started an epoch or not.
    """

    max_epochs: int = 30
    window_s: float = BUDGET_WINDOW_S
    _noted: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_MAX_NOTED)
    )

    def __post_init__(self) -> None:
        if self.max_epochs < 1 or not 0 < self.window_s < float("inf"):
            raise ValueError(
                f"need max_epochs >= 1 and a finite window_s > 0, got {self.max_epochs}, "
                f"{self.window_s}"
            )

    def count(self, now: float) -> int:
        """Discontinuities noted in the window ending at ``now``."""
        while self._noted and self._noted[0] <= now - self.window_s:
            self._noted.popleft()
        return len(self._noted)

    def spend(self, now: float) -> bool:
        """Note a discontinuity at ``now``; True if it may start an epoch."""
        allowed = self.count(now) < self.max_epochs
        self._noted.append(now)
        return allowed

    def calm(self, now: float) -> bool:
        """Few enough discontinuities (half the budget) to trust PTS again."""
        return self.count(now) <= self.max_epochs // 2


@dataclass(slots=True)
class Timeline:
    """Stamps raw decoder PTS with ``(epoch, unwrapped_pts)``.

    ``wrap_bits``: width of the source's PTS counter (33 for MPEG-TS), or
    ``None`` when PTS never wrap (MP4, MKV). Frames without a PTS (the first
    RTSP frames often have none) cannot be placed in time: callers drop and
    count them rather than invent a timestamp. ``budget``: the epoch budget
    (None: every discontinuity is an epoch); ``step``: one nominal frame in
    ``time_base`` units, the decode-order step.
    """

    time_base: Fraction
    wrap_bits: int | None = None
    max_jump_s: float = 10.0
    epoch: int = 0
    budget: EpochBudget | None = None
    step: int = 1
    corrupt: int = 0
    """Discontinuities that did not start an epoch (over the budget)."""
    decode_order: bool = False
    """PTS are not trusted: frames are stamped in decode order."""
    _offset: int = 0
    _last_raw: int | None = None
    _last_unwrapped: int | None = None
    _last_pts: int | None = None
    _pending_epoch: bool = False

    def new_epoch(self) -> None:
        """Start a new epoch at the next frame (call on reconnect or loop)."""
        self._pending_epoch = True

    def stamp(self, raw_pts: int, now: float = 0.0) -> tuple[int, int]:
        """Return ``(epoch, pts)`` for the next decoded frame (``now``: the budget's clock)."""
        jump = self._pending_epoch and self._last_pts is not None
        self._pending_epoch = False
        unwrapped = self._unwrap(raw_pts)
        last = self._last_unwrapped
        jump = jump or (last is not None and self._is_discontinuity(unwrapped - last))
        self._last_unwrapped = unwrapped
        if jump:
            return self._discontinuity(raw_pts, now)
        if self.decode_order:
            if self.budget is None or self.budget.calm(now):
                return self._trust_pts(raw_pts, now)
            return self._in_decode_order(raw_pts)
        self._last_pts = unwrapped
        return self.epoch, unwrapped

    def seconds(self, pts: int) -> float:
        return float(pts * self.time_base)

    def _discontinuity(self, raw: int, now: float) -> tuple[int, int]:
        self._restart_unwrap(raw)
        allowed = self.budget is None or self.budget.spend(now)
        if allowed and not self.decode_order:
            return self._start_epoch(raw)
        self.corrupt += 1
        self.decode_order = True
        return self._in_decode_order(raw)

    def _trust_pts(self, raw: int, now: float) -> tuple[int, int]:
        """Leave decode order: PTS are usable again, from a new epoch."""
        self.decode_order = False
        if self.budget is not None:
            self.budget.spend(now)
        self._restart_unwrap(raw)
        return self._start_epoch(raw)

    def _in_decode_order(self, raw: int) -> tuple[int, int]:
        last = self._last_pts
        pts = raw if last is None else last + self.step
        self._last_pts = pts
        return self.epoch, pts

    def _start_epoch(self, raw: int) -> tuple[int, int]:
        self.epoch += 1
        self._last_pts = raw
        return self.epoch, raw

    def _restart_unwrap(self, raw: int) -> None:
        self._offset = 0
        self._last_raw = self._last_unwrapped = raw

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
class FrameClock:
    """Decode-order time: each decoded frame advances it by the typical frame interval.

    The typical interval is the lower quartile of the last 9 positive PTS
    steps (up to 1 s) within an epoch, else ``step_s`` (the nominal frame
    duration). It follows a variable frame rate and corrects a wrong nominal
    rate, while damaged PTS (forward jumps, reordering) cannot speed it up: a
    jump moves it by one typical frame, and damage that shortens steps only
    slows it (fewer frames kept, never more). (A median was not enough: in a
    byte-flipped MP4 most steps are damaged.)
    """

    step_s: float = 1.0 / DEFAULT_FPS
    now: float = 0.0
    _epoch: int | None = None
    _last: float | None = None
    _steps: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_INTERVALS)
    )

    def tick(self, epoch: int | None = None, t: float | None = None) -> float:
        """One decoded frame (with its epoch and PTS seconds, if it has them)."""
        if t is not None:
            if epoch == self._epoch and self._last is not None:
                step = t - self._last
                if 0 < step <= _MAX_INTERVAL_S:
                    self._steps.append(step)
            self._epoch, self._last = epoch, t
        steps = self._steps
        self.now += sorted(steps)[len(steps) // 4] if steps else self.step_s
        return self.now


@dataclass(slots=True)
class Sampler:
    """Keeps frames at ``fps`` (``fps <= 0`` keeps every frame).

    By source time ``t`` (PTS seconds, or decode-order seconds), on one
    schedule across epochs: at a new epoch, time continues ``step_s`` (one
    frame) after the last frame seen, so a storm of epochs cannot burst. When
    ``now`` is given (the wall clock, or a :class:`FrameClock`), also a token
    bucket at ``fps`` with a burst of one on that clock: kept frames are at
    least ``1 / fps`` apart (less 1 ms of rounding), so over any window ``w``
    of it at most ``1 + w * fps`` frames are kept. A frame refused by the
    bucket leaves the schedule as it was: the next frame is kept instead.
    """

    fps: float
    step_s: float = 1.0 / DEFAULT_FPS
    _next: float | None = None
    _epoch: int | None = None
    _shift: float = 0.0
    _last: float | None = None
    _kept_at: float | None = None

    def keep(self, epoch: int, t: float, now: float | None = None) -> bool:
        if self.fps <= 0:
            return True
        ct = self._continuous(epoch, t)
        if self._next is None:
            self._next = ct
        period = 1.0 / self.fps
        if ct < self._next - _SLACK_S:
            return False
        if (
            now is not None
            and self._kept_at is not None
            and now - self._kept_at < period - _SLACK_S
        ):
            return False  # the clock says too soon: keep the schedule, try the next frame
        self._kept_at = now
        self._next += period
        if self._next < ct:  # after a gap, realign rather than burst
            self._next = ct + period
        return True

    def _continuous(self, epoch: int, t: float) -> float:
        if epoch != self._epoch:
            if self._last is not None:
                self._shift = self._last + self.step_s - t
            self._epoch = epoch
        ct = t + self._shift
        if self._last is not None and ct < self._last:  # never backwards (defensive)
            self._shift += self._last - ct
            ct = self._last
        self._last = ct
        return ct
