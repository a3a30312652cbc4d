"""Per-tunnel queues served round-robin: the worker's fairness between tunnels.

Each tunnel (connection) has its own FIFO lane. A lane may hold at most its
share of the capacity: ``capacity / busy lanes``, rounded up, counting the
lane asking (idle tunnels, e.g. the many a flooder opened and left, shrink
nobody's share). A lane below its share is taken even when the others filled
``capacity`` (they cannot add more until they drain below their own shares;
all lanes together hold at most twice ``capacity``), so one tunnel that floods
cannot take the slots another needs. A batch is taken lane by lane in turn,
starting after the lane served last; a lane's turn gives its first items, as
many as it has streams waiting (items are ``put`` with their stream as
``tag``), so every stream gets about the same share of inference whichever
tunnel carries it: an ingest's tunnel with two streams is not starved by a
flooder's tunnel with one, and a round holds one item per waiting stream
(a tunnel opens at most ``max_streams_per_connection`` streams, each with its
credits). Order within a lane (and so within a stream) is kept. ``taken``
counts the items ever taken, so a caller can tell how many were served
between an item's ``put`` and its own turn. Event-loop only: not thread-safe.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lanes(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._lanes: OrderedDict[int, deque[tuple[Hashable, T]]] = OrderedDict()
        self._tags: dict[int, Counter[Hashable]] = {}
        """Per lane: how many queued items each stream (tag) has."""
        self._next_key = 0
        self._size = 0
        self._busy = 0  # lanes holding at least one item
        self.taken = 0
        """Items taken since the lanes were made (every lane together)."""
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return self._size

    def share(self, key: int) -> int:
        """Most items lane ``key`` may hold now."""
        busy = self._busy + (0 if self._lanes.get(key) else 1)
        return max(1, math.ceil(self.capacity / busy))

    def open(self) -> int:
        """A new lane; returns its key."""
        key = self._next_key
        self._next_key += 1
        self._lanes[key] = deque()
        self._tags[key] = Counter()
        return key

    def close(self, key: int) -> list[T]:
        """Remove a lane; returns the items it still held (now dropped)."""
        lane = self._lanes.pop(key, None)
        self._tags.pop(key, None)
        if not lane:
            return []
        self._size -= len(lane)
        self._busy -= 1
        if not self._size:
            self._nonempty.clear()
        return [item for _, item in lane]

    def has_room(self, key: int) -> bool:
        """Whether lane ``key`` may take one more item now."""
        lane = self._lanes.get(key)
        if lane is None or len(lane) >= self.share(key):
            return False
        return self._size < 2 * self.capacity

    def put(self, key: int, item: T, tag: Hashable = None) -> bool:
        """Queue ``item`` (of stream ``tag``) in lane ``key``; False when the lane or the
        total is full."""
        if not self.has_room(key):
            return False
        lane = self._lanes[key]
        self._busy += not lane
        lane.append((tag, item))
        self._tags[key][tag] += 1
        self._size += 1
        self._nonempty.set()
        return True

    def take(self, n: int) -> list[T]:
        """Up to ``n`` items, lane by lane in turn (a turn: one per waiting stream)."""
        out: list[T] = []
        while len(out) < n and self._size:
            for key in list(self._lanes):
                if self._lanes[key]:
                    out += self._turn(key, n - len(out))
                    self._lanes.move_to_end(key)  # served: to the back of the round
                if len(out) == n:
                    break
        if not self._size:
            self._nonempty.clear()
        self.taken += len(out)
        return out

    def _turn(self, key: int, most: int) -> list[T]:
        """Lane ``key``'s turn: its first items, as many as it has streams waiting."""
        lane, tags = self._lanes[key], self._tags[key]
        out: list[T] = []
        for _ in range(min(most, len(tags))):
            tag, item = lane.popleft()
            tags[tag] -= 1
            if not tags[tag]:
                del tags[tag]
            out.append(item)
        self._size -= len(out)
        self._busy -= not lane
        return out

    async def wait(self) -> None:
        """Until at least one item is queued."""
        await self._nonempty.wait()
