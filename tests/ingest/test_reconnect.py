"""The reconnect loop, with a scripted source (no I/O); Backoff itself: tests/framerelay."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import pytest

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


def _runner(source: Scripted, hooks: Hooks, **kw: object) -> SourceRunner:
    backoff = Backoff(initial_s=0.001, max_s=0.004, jitter=0.0)
    return SourceRunner(source, hooks, threading.Event(), backoff=backoff, **kw)  # type: ignore[arg-type]


NET = SourceSpec(url="rtsp://cam/x", display="rtsp://cam/x", live=True, network=True)
FILE = SourceSpec(url="clip.mp4", display="clip.mp4", network=False)
DOWN = SourceUnavailable("refused")


def test_network_failures_are_retried_with_growing_then_capped_delays() -> None:
    source = Scripted(NET, [DOWN, DOWN, DOWN, DOWN, 5, 3])
    hooks = Hooks(frame_limit=8)
    _runner(source, hooks).run()
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.004, 0.004, 0.004]
    assert [n for n, _ in hooks.retries] == ["SourceUnavailable"] * 4 + ["SourceLost"]
    assert hooks.opened == 2 and hooks.frames == 8


def test_backoff_resets_only_after_a_healthy_session() -> None:
    source = Scripted(NET, [DOWN, DOWN, 2, DOWN, 2, 50])
    hooks = Hooks(frame_limit=60)
    _runner(source, hooks, healthy_after_s=3600).run()  # never healthy long enough
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.004, 0.004, 0.004, 0.004]
    source, hooks = Scripted(NET, [DOWN, DOWN, 2, DOWN, 50]), Hooks(frame_limit=60)
    _runner(source, hooks, healthy_after_s=0).run()  # any session with frames is healthy
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.001, 0.002, 0.001]


def test_max_retries_counts_failures_in_a_row() -> None:
    source = Scripted(NET, [DOWN, DOWN, 1, DOWN, DOWN, DOWN])
    hooks = Hooks()
    with pytest.raises(SourceError, match=r"gave up after 3 failed attempts in a row.*refused"):
        _runner(source, hooks, max_retries=2).run()
    assert len(hooks.retries) == 4  # 2, then a session with a frame resets the count, then 2


def test_a_local_file_is_not_retried_and_a_loop_restarts_at_once() -> None:
    with pytest.raises(SourceUnavailable):
        _runner(Scripted(FILE, [DOWN]), Hooks()).run()
    looping = SourceSpec(url="clip.mp4", display="clip.mp4", loop=True)
    source, hooks = Scripted(looping, ["end"]), Hooks()
    runner = _runner(source, hooks)
    threading.Timer(0.05, runner.stop.set).start()
    runner.run()
    assert hooks.opened > 3 and hooks.retries == []


def test_stop_interrupts_the_backoff_wait() -> None:
    backoff = Backoff(initial_s=30, max_s=30, jitter=0.0)
    stop = threading.Event()
    runner = SourceRunner(Scripted(NET, [DOWN]), Hooks(), stop, backoff=backoff)  # type: ignore[arg-type]
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    runner.run()
    assert time.monotonic() - started < 5
