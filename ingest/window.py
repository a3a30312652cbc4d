"""A fixed-size window of recent floats (a stream's result latencies).

The memory is taken once, at creation: a ``collections.deque`` of floats grows
by one float object and one slot per value until it is full, which for a
3 fps stream and a 4096-value window is 23 minutes of slow growth that a
memory soak cannot tell from a leak. Here the values live in one
``array('d')`` of ``size`` doubles (32 KiB for 4096), written round-robin.
"""

from __future__ import annotations

import array
from collections.abc import Iterator


class FloatWindow:
    """The last ``size`` values appended, oldest first when iterated."""

    __slots__ = ("_count", "_next", "_values")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window size must be at least 1, got {size}")
        self._values = array.array("d", [0.0]) * size
        self._next = 0
        self._count = 0

    @property
    def size(self) -> int:
        return len(self._values)

    def append(self, value: float) -> None:
        self._values[self._next] = value
        self._next = (self._next + 1) % len(self._values)
        self._count = min(self._count + 1, len(self._values))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[float]:
        start = (self._next - self._count) % len(self._values)
        for i in range(self._count):
            yield self._values[(start + i) % len(self._values)]

    def last(self, n: int) -> list[float]:
        """The newest ``n`` values (fewer when fewer are held), oldest first."""
        n = max(0, min(n, self._count))
        size = len(self._values)
        start = (self._next - n) % size
        return [self._values[(start + i) % size] for i in range(n)]
