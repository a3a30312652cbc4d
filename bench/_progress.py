"""A one-line progress bar on stderr for the long benches (terminals only).

``with Progress(6, "pipeline", "runs") as bar: ... bar.advance()`` counts
steps; ``Progress.timed(seconds, "soak")`` fills with the clock. The line is
redrawn every half second with the elapsed time and an estimate of what is
left; lines the bench prints meanwhile appear above it. When stderr is not a
terminal (logs, CI) nothing is drawn and the bench's own lines are unchanged.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from typing import TextIO

WIDTH = 28
REDRAW_S = 0.5


class Progress:
    def __init__(self, total: float, label: str, unit: str = "", *, by_clock: bool = False,
                 stream: TextIO | None = None, enabled: bool | None = None) -> None:  # fmt: skip
        self.total, self.label, self.unit, self.by_clock = max(total, 1e-9), label, unit, by_clock
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0.0
        self._start = time.monotonic()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._stdout: TextIO | None = None

    @classmethod
    def timed(cls, seconds: float, label: str, *, enabled: bool | None = None) -> Progress:
        """A bar that fills with the clock over ``seconds``."""
        return cls(seconds, label, by_clock=True, enabled=enabled)

    def advance(self, n: float = 1.0) -> None:
        with self._lock:
            self.done = min(self.total, self.done + n)
            self._draw()

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.enabled:
            self._stdout, sys.stdout = sys.stdout, _Above(sys.stdout, self)
            self._ticker.start()
            self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._ticker.join(2)
        with self._lock:
            self.clear()
            if isinstance(sys.stdout, _Above):
                sys.stdout.close()
            if self._stdout is not None:
                sys.stdout = self._stdout
            self.stream.write(f"{self.label}: done in {_clock(time.monotonic() - self._start)}\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        done = min(elapsed, self.total) if self.by_clock else self.done
        share = done / self.total
        bar = "#" * round(WIDTH * share) + "-" * (WIDTH - round(WIDTH * share))
        count = "" if self.by_clock else f" {self.done:g}/{self.total:g} {self.unit}".rstrip()
        left = self.total - elapsed if self.by_clock else elapsed / max(share, 1e-9) * (1 - share)
        eta = f", ~{_clock(left)} left" if 0 < share < 1 else ""
        return f"{self.label} [{bar}] {100 * share:3.0f}%{count} {_clock(elapsed)}{eta}"

    def clear(self) -> None:
        self.stream.write("\r\x1b[K")

    def _draw(self) -> None:
        if self.enabled and not self._stop.is_set():
            self.stream.write("\r\x1b[K" + self.line())
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW_S):
            with self._lock:
                self._draw()


class _Above(io.TextIOBase):
    """Standard output while a bar is drawn: whole lines go above the bar."""

    def __init__(self, real: TextIO, bar: Progress) -> None:
        self.real, self.bar, self._partial = real, bar, ""

    def write(self, text: str) -> int:
        with self.bar._lock:
            whole, newline, self._partial = (self._partial + text).rpartition("\n")
            if newline:
                self.bar.clear()
                self.real.write(whole + "\n")
                self.real.flush()
                self.bar._draw()
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def close(self) -> None:
        if self._partial:
            self.real.write(self._partial)
            self._partial = ""
        self.real.flush()


def _clock(seconds: float) -> str:
    h, rest = divmod(max(0, round(seconds)), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
