"""Process lifecycle helpers shared by the services."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Iterator


def install_signal_handlers(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (graceful shutdown with a deadline)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


@contextlib.contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """Keep what a service built at start-up out of the garbage collector's full passes.

    Modules, settings, the app and model sessions live as long as the process,
    yet every full (generation 2) collection walks them all, with the event
    loop stopped: every stream's frames wait. ``gc.freeze()`` after a first
    collection moves them to a permanent generation, so full passes walk only
    what the service made since (the same trick as large Django/Instagram
    servers use). Left on exit, so an embedding process gets its heap back.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
