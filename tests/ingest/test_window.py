"""FloatWindow: a fixed-size ring of floats (a stream's latency window)."""

from __future__ import annotations

import sys

import pytest

from ingest.window import FloatWindow


@pytest.mark.parametrize(
    ("size", "values", "held"),
    [
        (3, [], []),
        (3, [1.0], [1.0]),
        (3, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
        (3, [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0]),
        (3, [float(i) for i in range(10)], [7.0, 8.0, 9.0]),
        (1, [5.0, 6.0], [6.0]),
    ],
)
def test_holds_the_newest_values_oldest_first(
    size: int, values: list[float], held: list[float]
) -> None:
    w = FloatWindow(size)
    for v in values:
        w.append(v)
    assert list(w) == held
    assert len(w) == len(held)


def test_last_n() -> None:
    w = FloatWindow(4)
    for v in range(6):
        w.append(float(v))
    assert w.last(2) == [4.0, 5.0]
    assert w.last(10) == [2.0, 3.0, 4.0, 5.0]


def test_memory_is_taken_once() -> None:
    """Full or empty, the window is the same size: nothing grows while it fills."""
    w = FloatWindow(4096)
    empty = sys.getsizeof(w._values)
    for v in range(10_000):
        w.append(float(v))
    assert sys.getsizeof(w._values) == empty
    assert empty <= 4096 * 8 + 128


@pytest.mark.parametrize("size", [0, -1])
def test_refuses_an_empty_window(size: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FloatWindow(size)
