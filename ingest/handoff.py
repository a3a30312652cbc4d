"""Hand frames from a decode thread to the asyncio sender, newest first.

``LatestSlot`` holds at most one item. In *live* mode a new item replaces an
unsent one (which is returned so the caller can count the drop): latency stays
bounded whatever the consumer's speed. In *lossless* mode (files read as fast as
possible) ``put`` blocks the producer until the slot is free instead.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class SlotClosed(Exception):
    """The slot was closed while waiting."""


class LatestSlot(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, *, lossless: bool = False) -> None:
        self._loop = loop
        self._lossless = lossless
        self._cond = threading.Condition()
        self._item: T | None = None
        self._closed = False
        self._ready = asyncio.Event()

    def put(self, item: T) -> T | None:
        """From the producer thread. Returns the item it replaced, if any."""
        with self._cond:
            if self._lossless:
                while self._item is not None and not self._closed:
                    self._cond.wait(0.5)
            if self._closed:
                raise SlotClosed
            replaced, self._item = self._item, item
        self._loop.call_soon_threadsafe(self._ready.set)
        return replaced

    async def get(self) -> T:
        """From the event loop: wait for and take the newest item."""
        while True:
            with self._cond:
                item = self._item
                if item is not None:
                    self._item = None
                    self._cond.notify_all()
                    return item
                if self._closed:
                    raise SlotClosed
                self._ready.clear()
            await self._ready.wait()

    def empty(self) -> bool:
        with self._cond:
            return self._item is None

    def close(self) -> None:
        """Wake everyone; later puts and gets raise SlotClosed (a held item is kept for get)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._loop.call_soon_threadsafe(self._ready.set)
