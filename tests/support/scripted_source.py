"""A scripted source (no I/O) and the hooks of the ingest's reconnect loop
(:class:`ingest.reconnect.SourceRunner`), for tests of that loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from framerelay.backoff import Backoff
from framerelay.errors import SourceError
from ingest.reconnect import SourceRunner
from ingest.source import Decoded, Opened, SourceLost, SourceSpec, SourceUnavailable

OPENED = Opened(Fraction(1, 90_000), None, 25.0, "h264", "rtsp")


@dataclass
class Scripted:
    """A source whose sessions follow a script: an int = that many frames then a
    live disconnect, an exception = that failure at open, "end" = end of file."""

    spec: SourceSpec
    script: list[int | str | SourceError]
    sessions: int = 0
    stop_after: int | None = None
    released: int = 0

    def release(self) -> None:
        self.released += 1

    def session(
        self,
        stop: threading.Event,
        on_open: Callable[[Opened], None],
        on_frame: Callable[[Decoded], bool],
    ) -> None:
        step = self.script[min(self.sessions, len(self.script) - 1)]
        self.sessions += 1
        if isinstance(step, SourceError):
            raise step
        on_open(OPENED)
        if step == "end":
            return
        assert isinstance(step, int)
        for i in range(step):
            if not on_frame(Decoded(None, i, Fraction(1, 25), time.time())):  # type: ignore[arg-type]
                return
        raise SourceLost("camera hung up")


@dataclass
class Hooks:
    opened: int = 0
    frames: int = 0
    retries: list[tuple[str, float]] = field(default_factory=list)
    frame_limit: int | None = None

    def on_open(self, opened: Opened) -> None:
        self.opened += 1

    def on_frame(self, decoded: Decoded) -> bool:
        self.frames += 1
        return self.frame_limit is None or self.frames < self.frame_limit

    def on_retry(self, error: SourceError, delay_s: float) -> None:
        self.retries.append((type(error).__name__, delay_s))


def source_runner(source: Scripted, hooks: Hooks, **kw: object) -> SourceRunner:
    backoff = Backoff(initial_s=0.001, max_s=0.004, jitter=0.0)
    return SourceRunner(source, hooks, threading.Event(), backoff=backoff, **kw)  # type: ignore[arg-type]


NET = SourceSpec(url="rtsp://cam/x", display="rtsp://cam/x", live=True, network=True)


DOWN = SourceUnavailable("refused")
