"""In-process result bus: ids, a short history, and fan-out with bounded queues.

``publish`` gives every result its durable id (``"<ms>-<n>"``, increasing per
stream: the Redis Stream entry id when Redis is configured), keeps the last
``history`` results of each stream, none older than ``history_s`` (for
subscribers resuming after a short disconnect), calls the taps and offers the
result to every subscriber. The age limit makes the history reach its steady
size within ``history_s`` at any frame rate (1024 results of a 3 fps stream
would otherwise take 6 minutes to fill, growing the process all along).

The history holds each result as its id and JSON text, not as objects: a
record with its detections is some 25 objects the garbage collector tracks,
so 8 streams x 1024 results made every full collection walk ~200k objects
with the event loop stopped (100-300 ms here, every stream's frames waiting).
Strings and tuples of them are not tracked. A resume parses what it replays.

Each subscriber has its own queue (``maxsize``); when it is full the *oldest*
result is dropped and counted on that subscriber, so one slow consumer never
delays the others or the publisher. Publishing never blocks and never awaits.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from framerelay.errors import ProtocolError
from framerelay.results import ResultRecord

DEFAULT_HISTORY = 1024
DEFAULT_HISTORY_S = 120.0

IdKey = tuple[int, int]


def parse_id(text: str) -> IdKey:
    """``"<ms>-<n>"`` -> ``(ms, n)``, comparable in order."""
    ms, sep, n = text.partition("-")
    if not sep or not ms.isdigit() or not n.isdigit():
        raise ProtocolError(f"malformed result id {text[:40]!r}: expected '<ms>-<n>'")
    return int(ms), int(n)


def _age_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def format_id(key: IdKey) -> str:
    return f"{key[0]}-{key[1]}"


class IdAllocator:
    """Increasing ``(ms, n)`` ids per stream from the wall clock (never going back)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._last: dict[str, IdKey] = {}

    def next(self, stream_id: str) -> IdKey:
        ms = int(self._clock() * 1000)
        last = self._last.get(stream_id)
        key = (ms, 0) if last is None or ms > last[0] else (last[0], last[1] + 1)
        self._last[stream_id] = key
        return key

    def floor(self, stream_id: str, key: IdKey) -> None:
        """Make the next id of ``stream_id`` greater than ``key`` (Redis holds newer)."""
        last = self._last.get(stream_id)
        if last is None or key > last:
            self._last[stream_id] = key


@dataclass(frozen=True, slots=True)
class DetectionFilter:
    """A subscriber's class / confidence filter (``None`` classes: all)."""

    classes: frozenset[str] | None = None
    min_confidence: float = 0.0

    @property
    def passthrough(self) -> bool:
        return self.classes is None and self.min_confidence <= 0.0

    def apply(self, record: ResultRecord) -> ResultRecord:
        kept = [
            d
            for d in record.detections
            if d.confidence >= self.min_confidence
            and (self.classes is None or d.class_name in self.classes)
        ]
        if len(kept) == len(record.detections):
            return record
        return record.model_copy(update={"detections": kept})


@dataclass(slots=True, eq=False)
class Published:
    """A result with its id and its JSON encodings, made once and shared."""

    record: ResultRecord
    key: IdKey
    _json: str | None = None
    _bodies: dict[DetectionFilter, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return format_id(self.key)

    @property
    def stream_id(self) -> str:
        return self.record.stream_id

    def json(self) -> str:
        """The record as JSON (what Redis and JSON Lines files hold)."""
        if self._json is None:
            self._json = self.record.model_dump_json()
        return self._json

    def message(self, filt: DetectionFilter, dropped: int) -> str:
        """The ``result`` message for a subscriber with this filter and drop count."""
        body = self._bodies.get(filt)
        if body is None:
            text = self.json() if filt.passthrough else filt.apply(self.record).model_dump_json()
            body = '{"type":"result",' + text[1:-1]
            self._bodies[filt] = body
        return f'{body},"dropped":{dropped}}}'


class Subscription:
    """One subscriber's bounded queue (drop-oldest) and stream filter."""

    def __init__(
        self,
        bus: ResultBus,
        maxsize: int,
        streams: frozenset[str] | None,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self._bus = bus
        self._on_drop = on_drop
        self.streams = streams
        self.queue: asyncio.Queue[Published] = asyncio.Queue(maxsize=maxsize)
        self.dropped = 0
        self.closed = False

    def wants(self, stream_id: str) -> bool:
        return self.streams is None or stream_id in self.streams

    def offer(self, item: Published) -> None:
        if not self.wants(item.stream_id):
            return
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
            self._bus.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
        self.queue.put_nowait(item)

    async def get(self) -> Published:
        return await self.queue.get()

    def close(self) -> None:
        self.closed = True
        self._bus.unsubscribe(self)


class ResultBus:
    """Publish results to every interested subscriber; never blocks."""

    def __init__(
        self,
        *,
        history: int = DEFAULT_HISTORY,
        history_s: float = DEFAULT_HISTORY_S,
        ids: IdAllocator | None = None,
    ) -> None:
        self._subs: list[Subscription] = []
        self._taps: list[Callable[[ResultRecord], None]] = []
        self._observers: list[Callable[[Published], None]] = []
        self._history: dict[str, collections.deque[tuple[IdKey, str]]] = {}
        self._history_len = max(0, history)
        self._history_ms = _age_ms(history_s)
        self.ids = ids or IdAllocator()
        self.published = 0
        self.dropped = 0

    def subscribe(
        self,
        *,
        maxsize: int = 256,
        streams: frozenset[str] | None = None,
        on_drop: Callable[[], None] | None = None,
    ) -> Subscription:
        sub = Subscription(self, maxsize, streams, on_drop)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def tap(self, func: Callable[[ResultRecord], None]) -> None:
        """A synchronous observer called for every result (must be fast)."""
        self._taps.append(func)

    def observe(self, func: Callable[[Published], None]) -> None:
        """Like :meth:`tap`, with the id and the shared JSON encoding (Redis publisher)."""
        self._observers.append(func)

    def publish(self, record: ResultRecord) -> None:
        """Give ``record`` its id and hand it to history, taps and subscribers."""
        self.push(record)

    def push(self, record: ResultRecord) -> Published:
        """:meth:`publish`, returning the published item."""
        key = self.ids.next(record.stream_id)
        item = Published(record.model_copy(update={"id": format_id(key)}), key)
        self.published += 1
        if self._history_len:
            ring = self._history.get(record.stream_id)
            if ring is None:
                ring = self._history[record.stream_id] = collections.deque(maxlen=self._history_len)
            ring.append((item.key, item.json()))
            while self._history_ms and ring[0][0][0] < key[0] - self._history_ms:
                ring.popleft()
        for func in self._taps:
            func(item.record)
        for obs in self._observers:
            obs(item)
        for sub in self._subs:
            sub.offer(item)
        return item

    def resize_history(self, size: int, max_age_s: float | None = None) -> None:
        """Keep ``size`` results per stream from now on (0: none), none older than
        ``max_age_s`` (0: no age limit; None: unchanged)."""
        if max_age_s is not None:
            self._history_ms = _age_ms(max_age_s)
        self._history_len = max(0, size)
        self._history = {
            k: collections.deque(v, maxlen=self._history_len) for k, v in self._history.items()
        } if self._history_len else {}  # fmt: skip

    def history(
        self, stream_id: str, after: IdKey | None = None, limit: int | None = None
    ) -> list[Published]:
        """Results of ``stream_id`` still held, oldest first, newer than ``after``; at most
        ``limit`` (the oldest of them): only those are parsed."""
        ring: Iterable[tuple[IdKey, str]] = self._history.get(stream_id, ())
        newer = ((key, text) for key, text in ring if after is None or key > after)
        return [
            Published(ResultRecord.model_validate_json(text), key, text)
            for key, text in itertools.islice(newer, limit)
        ]

    def oldest(self, stream_id: str) -> IdKey | None:
        ring = self._history.get(stream_id)
        return ring[0][0] if ring else None

    @property
    def subscribers(self) -> int:
        return len(self._subs)
