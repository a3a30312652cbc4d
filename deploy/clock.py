"""Time, injected: the service uses the system clock; tests and the simulated
day use :class:`FakeClock`, so a whole day of schedule runs in seconds."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float | datetime) -> None:
        self._t = start.timestamp() if isinstance(start, datetime) else float(start)

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds


def as_datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)
