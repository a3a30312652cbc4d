"""In-process result bus: ids, a short history, and fan-out with bounded queues.

``publish`` settles every result's durable id (a :class:`ResultId`, increasing per
stream) once, before any fan-out: the record every tap, observer (Redis, under
that very entry id) and subscriber gets already carries it, and nothing
renames it later (see :mod:`ingest.redis_bus` for what happens when Redis
refuses an id). It keeps the last
``history`` results of each stream, none older than ``history_s`` (for
subscribers resuming after a short disconnect), calls the taps and offers the
result to every subscriber. The age limit makes the history reach its steady
size within ``history_s`` at any frame rate (1024 results of a 3 fps stream
would otherwise take 6 minutes to fill, growing the process all along).

The history holds each result as ``(ms, seq, JSON text)``, not as objects: a
record with its detections is some 25 objects the garbage collector tracks,
so 8 streams x 1024 results made every full collection walk ~200k objects
with the event loop stopped (100-300 ms here, every stream's frames waiting).
Strings, ints and plain tuples of them are not tracked (a ``ResultId`` would
be). A resume parses what it replays.

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

from framerelay.results import ResultId, ResultRecord
from framerelay.schemas import SharedResultMessage

DEFAULT_HISTORY = 1024
DEFAULT_HISTORY_S = 120.0

_Held = tuple[int, int, str]
"""A history entry: the id's ``ms`` and ``seq`` and the record's JSON (GC-untracked)."""


def _age_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


class IdAllocator:
    """Increasing ids per stream from the wall clock (never going back): the one place
    result ids are made."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._last: dict[str, ResultId] = {}

    def next(self, stream_id: str) -> ResultId:
        ms = int(self._clock() * 1000)
        last = self._last.get(stream_id)
        rid = ResultId(ms) if last is None or ms > last.ms else last.successor()
        self._last[stream_id] = rid
        return rid

    def floor(self, stream_id: str, rid: ResultId) -> None:
        """Make every later id of ``stream_id`` greater than ``rid`` (Redis holds newer)."""
        last = self._last.get(stream_id)
        if last is None or rid > last:
            self._last[stream_id] = rid

    def last(self, stream_id: str) -> ResultId | None:
        return self._last.get(stream_id)

    def forget_before(self, ms: int) -> None:
        """Forget streams whose last id is older than ``ms`` (removed streams: a later
        id of the same stream comes from the wall clock, after ``ms``, all the same)."""
        for stream_id in [k for k, rid in self._last.items() if rid.ms < ms]:
            del self._last[stream_id]


@dataclass(frozen=True, slots=True)
class DetectionFilter:
    """A subscriber's class / confidence filter (``None`` classes: all)."""

    classes: frozenset[str] | None = None
    min_confidence: float = 0.0

    @property
    def passthrough(self) -> bool:
        return self.classes is None and self.min_confidence <= 0.0

    def apply(self, record: ResultRecord) -> ResultRecord:
        if self.passthrough:
            return record
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
    """A result with its settled id and its encodings, each made once and shared."""

    record: ResultRecord
    id: ResultId
    _json: str | None = None
    _messages: dict[DetectionFilter, SharedResultMessage] = field(default_factory=dict)

    @classmethod
    def settled(cls, record: ResultRecord, rid: ResultId, text: str | None = None) -> Published:
        """``record`` under ``rid`` (``text``: its JSON, when at hand)."""
        if record.id != rid:
            record = record.model_copy(update={"id": rid})
            text = None
        return cls(record, rid, text)

    @property
    def stream_id(self) -> str:
        return self.record.stream_id

    def json(self) -> str:
        """The record as JSON (what Redis and JSON Lines files hold)."""
        if self._json is None:
            self._json = self.record.model_dump_json()
        return self._json

    def message(self, filt: DetectionFilter, dropped: int) -> str:
        """The :class:`~framerelay.schemas.ResultMessage` text for a subscriber with this
        filter and drop count (encoded once per filter, shared by its subscribers)."""
        shared = self._messages.get(filt)
        if shared is None:
            shared = SharedResultMessage.of(filt.apply(self.record))
            self._messages[filt] = shared
        return shared.text(dropped)


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
        self._history: dict[str, collections.deque[_Held]] = {}
        self._history_len = max(0, history)
        self._history_ms = _age_ms(history_s)
        self.ids = ids or IdAllocator()
        self.dropped = 0
        self._swept_ms = 0

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
        rid = self.ids.next(record.stream_id)
        item = Published.settled(record, rid)
        if self._history_len:
            ring = self._history.get(record.stream_id)
            if ring is None:
                ring = self._history[record.stream_id] = collections.deque(maxlen=self._history_len)
            ring.append((rid.ms, rid.seq, item.json()))
            while self._history_ms and ring[0][0] < rid.ms - self._history_ms:
                ring.popleft()
        self._sweep(rid.ms)
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

    def _sweep(self, now_ms: int) -> None:
        """Every ``history_s`` or so, drop what streams that stopped publishing (removed
        ones) still hold: their history and their last id, so a long-running ingest
        with streams coming and going does not keep every one it ever had."""
        if not self._history_ms or now_ms - self._swept_ms < self._history_ms:
            return
        self._swept_ms = now_ms
        cutoff = now_ms - self._history_ms
        for stream_id in [k for k, ring in self._history.items() if ring[-1][0] < cutoff]:
            del self._history[stream_id]
        self.ids.forget_before(cutoff)

    def history(
        self, stream_id: str, after: ResultId | None = None, limit: int | None = None
    ) -> list[Published]:
        """Results of ``stream_id`` still held, oldest first, newer than ``after``; at most
        ``limit`` (the oldest of them): only those are parsed."""
        ring: Iterable[_Held] = self._history.get(stream_id, ())
        floor = (-1, -1) if after is None else (after.ms, after.seq)
        newer = (held for held in ring if (held[0], held[1]) > floor)
        return [
            Published(ResultRecord.model_validate_json(text), ResultId(ms, seq), text)
            for ms, seq, text in itertools.islice(newer, limit)
        ]

    def oldest(self, stream_id: str) -> ResultId | None:
        ring = self._history.get(stream_id)
        return ResultId(ring[0][0], ring[0][1]) if ring else None

    @property
    def subscribers(self) -> int:
        return len(self._subs)
