"""Stop a blocking PyAV open or read at once when its source is stopped.

FFmpeg polls an interrupt callback while it waits for data (about every 0.1 s
on UDP). PyAV's callback (``av.container.core``) aborts the call once its
clock, ``time.monotonic()`` looked up on that module at each call, passes the
open or read timeout; PyAV has no API to abort it otherwise. So a stopped
source kept waiting for the whole read timeout: a deleted UDP stream held its
port for ~10 s and re-adding it failed with "Address already in use".

:func:`watching` registers a decode thread with its stop event; PyAV's
module gets a clock that is the real one, except in a registered thread whose
stop is set: there it jumps 10^6 s further at every call, so the callback
aborts the call in progress (FFmpeg returns AVERROR_EXIT, PyAV raises
``av.error.ExitError``) and the thread closes the container. If PyAV changes
how its callback reads the clock, nothing breaks: stopping falls back to the
read timeout (``tests/ingest/test_udp_readd.py`` notices).
"""

from __future__ import annotations

import contextlib
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

JUMP_S = 1e6


class _StopAwareClock(types.ModuleType):
    """The ``time`` module as PyAV's container core sees it."""

    def __init__(self) -> None:
        super().__init__("time")
        self._watched: dict[int, threading.Event] = {}
        self._jump: dict[int, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        ident = threading.get_ident()
        stop = self._watched.get(ident)
        if stop is None or not stop.is_set():
            return time.monotonic()
        jump = self._jump.get(ident, 0.0) + JUMP_S  # each call later: no wait can last
        self._jump[ident] = jump
        return time.monotonic() + jump

    @contextlib.contextmanager
    def watching(self, stop: threading.Event) -> Iterator[None]:
        ident = threading.get_ident()
        self._watched[ident] = stop
        try:
            yield
        finally:
            self._watched.pop(ident, None)
            self._jump.pop(ident, None)


_CLOCK = _StopAwareClock()
_lock = threading.Lock()


def _install() -> None:
    import av.container.core as core

    with _lock:
        if getattr(core, "time", None) is not _CLOCK:
            core.time = _CLOCK  # type: ignore[attr-defined]


def watching(stop: threading.Event) -> contextlib.AbstractContextManager[None]:
    """While in this block, PyAV calls of this thread return soon after ``stop`` is set."""
    _install()
    return _CLOCK.watching(stop)
