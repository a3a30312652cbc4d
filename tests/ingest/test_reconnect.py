"""The reconnect loop, with a scripted source (no I/O); Backoff itself: tests/framerelay."""

from __future__ import annotations

import threading
import time

import pytest

from framerelay.backoff import Backoff
from framerelay.errors import SourceError
from ingest.reconnect import SourceRunner
from ingest.source import SourceSpec, SourceUnavailable
from tests.support.scripted_source import DOWN, NET, Hooks, Scripted, source_runner

FILE = SourceSpec(url="clip.mp4", display="clip.mp4", network=False)


def test_network_failures_are_retried_with_growing_then_capped_delays() -> None:
    source = Scripted(NET, [DOWN, DOWN, DOWN, DOWN, 5, 3])
    hooks = Hooks(frame_limit=8)
    source_runner(source, hooks).run()
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.004, 0.004, 0.004]
    assert [n for n, _ in hooks.retries] == ["SourceUnavailable"] * 4 + ["SourceLost"]
    assert hooks.opened == 2 and hooks.frames == 8


def test_backoff_resets_only_after_a_healthy_session() -> None:
    source = Scripted(NET, [DOWN, DOWN, 2, DOWN, 2, 50])
    hooks = Hooks(frame_limit=60)
    source_runner(source, hooks, healthy_after_s=3600).run()  # never healthy long enough
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.004, 0.004, 0.004, 0.004]
    source, hooks = Scripted(NET, [DOWN, DOWN, 2, DOWN, 50]), Hooks(frame_limit=60)
    source_runner(source, hooks, healthy_after_s=0).run()  # any session with frames is healthy
    assert [d for _, d in hooks.retries] == [0.001, 0.002, 0.001, 0.002, 0.001]


def test_max_retries_counts_failures_in_a_row() -> None:
    source = Scripted(NET, [DOWN, DOWN, 1, DOWN, DOWN, DOWN])
    hooks = Hooks()
    with pytest.raises(SourceError, match=r"gave up after 3 failed attempts in a row.*refused"):
        source_runner(source, hooks, max_retries=2).run()
    assert len(hooks.retries) == 4  # 2, then a session with a frame resets the count, then 2


def test_a_local_file_is_not_retried_and_a_loop_restarts_at_once() -> None:
    with pytest.raises(SourceUnavailable):
        source_runner(Scripted(FILE, [DOWN]), Hooks()).run()
    looping = SourceSpec(url="clip.mp4", display="clip.mp4", loop=True)
    source, hooks = Scripted(looping, ["end"]), Hooks()
    runner = source_runner(source, hooks)
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
