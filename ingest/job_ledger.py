"""The bookkeeping of one job task: which sampled frames were sent, answered and made
durable, and so where its checkpoint is. No I/O; thread-safe (the decode thread admits
frames, the event loop records answers and flushes).

A frame is named by its PTS (the one the ingest stamps and the result carries; a file's
own PTS). The task's *checkpoint* (``floor``) is a PTS below which every sampled frame
is in the sidecar, flushed to disk. A *pass* reads the input from the checkpoint:

- :meth:`TaskLedger.admit` (decode thread, every sampled frame): below the checkpoint or
  already in the sidecar, the frame is skipped; else it is *pending* and is sent. It
  raises :class:`Rewind` when frames were lost meanwhile (the pass starts over at the
  checkpoint), or :class:`TaskStuck` after :data:`MAX_STUCK_REWINDS` such starts without
  the checkpoint moving (a frame the workers always lose).
- :meth:`TaskLedger.answered` (event loop): a result was written to the sidecar (not
  flushed yet); :meth:`TaskLedger.lost`: a frame in flight will never be answered.
- :meth:`TaskLedger.flushing` then :meth:`TaskLedger.durable` (the keeper, around a
  flush and fsync): the written frames are durable; the checkpoint moves to the lowest
  frame still pending or unflushed, or just past the last admitted one.

Frames come out of the decoder in presentation order, so every sampled frame below the
last admitted one was admitted or skipped in this pass.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from framerelay.errors import FramerelayError
from framerelay.timeline import Timeline
from ingest.resume import ResumeAt

MAX_STUCK_REWINDS = 10
"""Passes started over without the checkpoint moving before the task fails."""


class JobReader(Protocol):
    """What a job task's stream asks of the task (:class:`ingest.job_task.JobRun`)."""

    def wants(self, pts: int, timeline: Timeline) -> bool:
        """Decode thread: whether to send this frame (:func:`sampled`, :meth:`TaskLedger.
        admit`)."""

    def offered(self, pts: int) -> None:
        """Decode thread: the frame goes to the sender."""

    def read(self, run_pass: Callable[[ResumeAt | None], None], stop: threading.Event) -> None:
        """Decode thread: every pass over the input (``run_pass`` from a position) until
        the task's end is recorded or ``stop``."""


class Rewind(Exception):
    """Frames in flight were lost: read the input again from the checkpoint."""


class TaskStuck(FramerelayError):
    """The task starts over at the same checkpoint again and again: it fails."""


def sampled(pts: int, step: int, time_base: Fraction, fps: float) -> bool:
    """Whether the frame at ``pts`` is analysed at ``fps`` (0: every frame).

    A fixed rule of the frame's own PTS, so every pass (and every replica) picks the same
    frames: the frame is kept when a multiple of ``1/fps`` seconds lies in
    ``(t - step, t]``, ``t`` its time and ``step`` one frame (in ``time_base`` units).
    At a constant frame rate that is the first frame at or after each multiple.
    """
    if fps <= 0:
        return True
    rate = Fraction(fps)
    return math.floor(pts * time_base * rate) != math.floor((pts - step) * time_base * rate)


@dataclass(frozen=True, slots=True)
class Figures:
    """The ledger's figures at one moment (for the task's progress)."""

    checkpoint: int | None
    frames_done: int
    complete: bool
    """The pass reached the end of the input and every frame is answered and durable."""


class TaskLedger:
    """One task's frames between the decode thread, the results and the sidecar."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ready = threading.Event()
        """Set by :meth:`begin`: the checkpoint and the sidecar are known."""
        self.settled = threading.Event()
        """Set once the end was recorded (progress ``done``): the decode thread may end."""
        self.floor: int | None = None
        self.frames_done = 0
        self.rewinds = 0
        self._pending: set[int] = set()
        self._unflushed: set[int] = set()
        self._known: set[int] = set()
        """Frames in the sidecar at or above the checkpoint (below it nothing is read)."""
        self._frontier: int | None = None
        self._ended = False
        self._rewind_due = False
        self._stuck = 0
        self._floor_at_rewind: int | None = None

    # -- start -----------------------------------------------------------------------

    def begin(self, floor: int | None, known: Iterable[int], frames_done: int) -> None:
        """The task starts at checkpoint ``floor`` with ``known`` frames already in its
        sidecar (``frames_done`` lines)."""
        with self._lock:
            self.floor = floor
            self._known = {p for p in known if floor is None or p >= floor}
            self.frames_done = frames_done
        self.ready.set()

    # -- decode thread ---------------------------------------------------------------

    def admit(self, pts: int) -> bool:
        """A sampled frame: True to send it (then :meth:`offered`); False: below the
        checkpoint or in the sidecar. :class:`Rewind` or :class:`TaskStuck` when the pass
        must start over."""
        with self._lock:
            if self._rewind_due:
                self._restart()
            if self.floor is not None and pts < self.floor:
                return False
            if pts in self._known:
                self._advance(pts)
                return False
            return True

    def offered(self, pts: int) -> None:
        """The frame is handed to the sender: pending until answered (a frame admitted but
        never offered, e.g. one the encoder refused, is passed over)."""
        with self._lock:
            self._pending.add(pts)
            self._advance(pts)

    def _advance(self, pts: int) -> None:
        if self._frontier is None or pts > self._frontier:
            self._frontier = pts

    def end_of_input(self) -> None:
        """The pass decoded the whole input."""
        with self._lock:
            self._ended = True

    def wait_end(self, stop: threading.Event, poll_s: float = 0.1) -> None:
        """At the end of the input, until the end is recorded (returns), a frame is lost
        (:class:`Rewind`) or ``stop`` (returns)."""
        while not stop.is_set() and not self.settled.wait(poll_s):
            with self._lock:
                if self._rewind_due:
                    self._restart()

    def _restart(self) -> None:
        """Start the pass over (lock held): raises Rewind, or TaskStuck."""
        self._stuck = self._stuck + 1 if self.floor == self._floor_at_rewind else 1
        self._floor_at_rewind = self.floor
        self._rewind_due = self._ended = False
        self._pending.clear()
        self._frontier = None
        self.rewinds += 1
        if self._stuck > MAX_STUCK_REWINDS:
            raise TaskStuck(
                f"frames at PTS {self.floor} and after were lost {self._stuck} times in a row "
                "(the workers never answer them): task failed"
            )
        raise Rewind

    # -- event loop ------------------------------------------------------------------

    def is_known(self, pts: int) -> bool:
        """The frame's result is in the sidecar already (or below the checkpoint)."""
        with self._lock:
            return (self.floor is not None and pts < self.floor) or pts in self._known

    def answered(self, pts: int) -> None:
        """The frame's result was written to the sidecar (not flushed yet)."""
        with self._lock:
            self._pending.discard(pts)
            self._unflushed.add(pts)
            self._known.add(pts)
            self.frames_done += 1

    def lost(self) -> None:
        """Frames in flight will never be answered: the pass starts over."""
        with self._lock:
            self._rewind_due = True

    def flushing(self) -> frozenset[int]:
        """The frames written so far (call, then flush and fsync, then :meth:`durable`)."""
        with self._lock:
            return frozenset(self._unflushed)

    def durable(self, flushed: frozenset[int]) -> Figures:
        """``flushed`` are on disk: move the checkpoint; the figures now."""
        with self._lock:
            self._unflushed -= flushed
            holes = self._pending | self._unflushed
            if self._frontier is not None:
                candidate = min(holes | {self._frontier + 1})
                if self.floor is None or candidate > self.floor:
                    self.floor = candidate
                    self._known = {p for p in self._known if p >= candidate}
            complete = self._ended and not holes and not self._rewind_due
            return Figures(self.floor, self.frames_done, complete)
