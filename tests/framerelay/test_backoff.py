"""The one Backoff: capped exponential delays with bounded jitter."""

from __future__ import annotations

import math
import random

import pytest

from framerelay.backoff import Backoff


@pytest.mark.parametrize("jitter", [0.0, 0.2])
def test_doubles_up_to_the_cap_with_bounded_jitter(jitter: float) -> None:
    b = Backoff(initial_s=0.5, max_s=10.0, jitter=jitter)
    rng = random.Random(7)
    delays = [b.next_delay(rng) for _ in range(8)]
    for n, d in enumerate(delays):
        base = min(10.0, 0.5 * 2**n)
        assert base * (1 - jitter) <= d <= min(10.0, base * (1 + jitter))
    assert delays[-1] <= 10.0
    assert b.attempt == 8
    b.reset()
    assert b.peek() == 0.5 and b.attempt == 0


def test_without_jitter_the_delays_are_exact() -> None:
    b = Backoff(1.0, 5.0, jitter=0.0)
    assert [b.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(-3, 10.0), (0, 10.0), (1, 20.0), (5, 320.0), (6, 600.0), (10**9, 600.0)],
)
def test_delay_is_the_stateless_curve(attempt: int, expected: float) -> None:
    """What the orchestrator uses with the failure count it keeps in Redis."""
    b = Backoff(10.0, 600.0, jitter=0.0)
    assert b.delay(attempt) == expected
    assert b.attempt == 0


def test_jitter_stays_in_its_band_and_below_the_cap() -> None:
    b = Backoff(1.0, 1.0, jitter=0.5)
    rng = random.Random(1)
    spread = [b.jittered(2.0, rng) for _ in range(500)]
    assert 1.0 <= min(spread) and max(spread) <= 3.0
    assert max(spread) > 2.5 and min(spread) < 1.5  # uses the band, not one value
    assert all(b.next_delay(rng) <= 1.0 for _ in range(50))


def test_a_factor_of_one_is_a_constant_delay() -> None:
    b = Backoff(3.0, 3.0, factor=1.0, jitter=0.0)
    assert {b.next_delay() for _ in range(4)} == {3.0}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_s": 0, "max_s": 1}, "need"),
        ({"initial_s": 2, "max_s": 1}, "need"),
        ({"initial_s": -1, "max_s": 1}, "need"),
        ({"initial_s": math.nan, "max_s": 1}, "finite"),
        ({"initial_s": 1, "max_s": math.inf}, "finite"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"factor": 0.5}, "factor"),
        ({"factor": math.inf}, "factor"),
    ],
)
def test_rejects_nonsense(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)  # type: ignore[arg-type]
