"""In-process result bus: fan-out to subscribers with bounded queues.

Each subscriber has its own queue (``maxsize``); when it is full the *oldest*
result is dropped and counted on that subscriber, so one slow consumer never
delays the others or the publisher. With ``FRAMERELAY_REDIS_URL`` set the same
records also go to Redis (see the results-delivery docs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from framerelay.results import ResultRecord


class Subscription:
    def __init__(self, bus: ResultBus, maxsize: int, streams: frozenset[str] | None) -> None:
        self._bus = bus
        self.streams = streams
        self.queue: asyncio.Queue[ResultRecord] = asyncio.Queue(maxsize=maxsize)
        self.dropped = 0
        self.closed = False

    def offer(self, record: ResultRecord) -> None:
        if self.streams is not None and record.stream_id not in self.streams:
            return
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(record)

    async def get(self) -> ResultRecord:
        return await self.queue.get()

    def close(self) -> None:
        self.closed = True
        self._bus.unsubscribe(self)

    async def __aiter__(self) -> AsyncIterator[ResultRecord]:
        while not self.closed:
            yield await self.queue.get()


class ResultBus:
    """Publish results to every interested subscriber; never blocks."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._taps: list[Callable[[ResultRecord], None]] = []
        self.published = 0

    def subscribe(
        self, *, maxsize: int = 256, streams: frozenset[str] | None = None
    ) -> Subscription:
        sub = Subscription(self, maxsize, streams)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def tap(self, func: Callable[[ResultRecord], None]) -> None:
        """A synchronous observer called for every result (must be fast)."""
        self._taps.append(func)

    def publish(self, record: ResultRecord) -> None:
        self.published += 1
        for func in self._taps:
            func(record)
        for sub in self._subs:
            sub.offer(record)

    @property
    def subscribers(self) -> int:
        return len(self._subs)
