"""Credit window state machine (pure)."""

from __future__ import annotations

import pytest

from framerelay.credits import CreditWindow


def test_at_most_limit_in_flight() -> None:
    w = CreditWindow(cap=4, limit=2)
    w.sent(0, 0.0)
    w.sent(1, 0.0)
    assert not w.can_send()
    with pytest.raises(RuntimeError, match="no credit"):
        w.sent(2, 0.0)
    assert w.completed(0, 0.05) == pytest.approx(0.05)
    assert w.can_send()


def test_unknown_completion_is_ignored() -> None:
    w = CreditWindow()
    assert w.completed(42, 1.0) is None


@pytest.mark.parametrize(
    ("fps", "rtt", "in_worker", "cap", "limit"),
    [
        (25, 0.021, 0.020, 4, 1),  # loopback: one frame in flight is enough
        (25, 0.100, 0.020, 4, 3),  # 80 ms network at 25 fps: 1 + 2
        (5, 0.100, 0.020, 4, 2),  # 80 ms network at 5 fps: 1 + 1
        (25, 1.000, 0.020, 4, 4),  # capped
        (25, 0.500, 0.499, 4, 1),  # a slow worker earns no extra credit
        (0, 0.500, 0.0, 4, 1),  # unknown rate: keep the current limit
    ],
)
def test_resize_covers_the_network_not_the_worker(
    fps: float, rtt: float, in_worker: float, cap: int, limit: int
) -> None:
    w = CreditWindow(cap=cap, limit=1, alpha=1.0)
    w.sent(0, 0.0)
    w.completed(0, rtt, worker_s=in_worker)
    assert w.resize(fps) == limit


def test_expire_and_abandon_return_credits() -> None:
    w = CreditWindow(cap=3, limit=3)
    for s in range(3):
        w.sent(s, float(s))
    assert w.expire(now=11.5, timeout_s=10) == [0, 1]
    assert w.available == 2
    assert w.abandon() == 1
    assert w.available == 3


def test_invalid_cap() -> None:
    with pytest.raises(ValueError, match="cap"):
        CreditWindow(cap=0)
