"""The inference loop's heartbeat and the watchdog that reads it.

The batcher stamps a :class:`Heartbeat` when a batch starts and when it
finishes. Every ``interval_s`` the :class:`Watchdog` checks that the loop task
still runs and that no batch has run longer than ``stall_s``; on the first
check that fails it calls ``on_stall(reason)`` (the worker turns unready and
closes its tunnels), and ``on_recover()`` when a stalled batch finishes after
all. A loop that ended stays failed: the worker must be replaced.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Heartbeat:
    """Monotonic times of the inference loop (written and read on the event loop).

    A batch is busy from ``started`` to ``finished``; with the JPEG decode stage in
    front of inference two batches can be in flight (one decoding, one inferring), and
    they finish in the order they started: ``busy_since`` is the oldest one's start.
    """

    starts: deque[float] = field(default_factory=deque)
    """Start times of the batches in flight, oldest first."""
    last_finished: float | None = None
    batches: int = 0

    @property
    def busy_since(self) -> float | None:
        """When the oldest batch in flight started; None when idle."""
        return self.starts[0] if self.starts else None

    def started(self, now: float) -> None:
        self.starts.append(now)

    def finished(self, now: float) -> None:
        if self.starts:
            self.starts.popleft()
        self.last_finished = now
        self.batches += 1

    def busy_for(self, now: float) -> float:
        """Seconds the oldest batch in flight has run (0 when idle)."""
        since = self.busy_since
        return 0.0 if since is None else max(0.0, now - since)


def ended_reason(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "inference loop ended: cancelled"
    exc = task.exception()
    if exc is None:
        return "inference loop ended"
    return f"inference loop ended: {type(exc).__name__}: {exc}"[:300]


class Watchdog:
    def __init__(
        self,
        heartbeat: Heartbeat,
        stall_s: float,
        *,
        on_stall: Callable[[str], None],
        on_recover: Callable[[], None],
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        self.heartbeat = heartbeat
        self.stall_s = stall_s
        self.interval_s = min(interval_s, stall_s / 4)
        self.reason: str | None = None
        """Why inference is unhealthy now (None: healthy)."""
        self.busy_s = 0.0
        self._on_stall, self._on_recover = on_stall, on_recover
        self._clock = clock
        self._on_tick = on_tick  # gets busy_s at every check (a gauge)
        self._task: asyncio.Task[None] | None = None

    def watch(self, task: asyncio.Task[None]) -> None:
        self._task = task

    def check(self) -> str | None:
        """One look; calls the callbacks on a change; returns the current reason."""
        reason = self._diagnose()
        if reason is not None and self.reason is None:
            self.reason = reason
            self._on_stall(reason)
        elif reason is None and self.reason is not None:
            self.reason = None
            self._on_recover()
        self.reason = reason
        return reason

    def _diagnose(self) -> str | None:
        self.busy_s = self.heartbeat.busy_for(self._clock())
        if self._on_tick is not None:
            self._on_tick(self.busy_s)
        if self._task is not None and self._task.done():
            return ended_reason(self._task)
        if self.busy_s > self.stall_s:
            busy, limit = self.busy_s, self.stall_s
            return f"inference stalled: a batch has run for {busy:.1f} s (limit {limit:g} s)"
        return None

    async def run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.interval_s)
