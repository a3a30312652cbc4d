"""Credit window state machine (pure)."""

from __future__ import annotations

import pytest

from framerelay.credits import CreditWindow, waited_s


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
    ("fps", "rtt", "waited", "cap", "limit"),
    [
        (25, 0.024, 0.0, 4, 1),  # loopback, 20 ms inference: one frame in flight
        (25, 0.100, 0.0, 4, 3),  # 80 ms network + 20 ms at 25 fps
        (5, 0.100, 0.0, 4, 1),  # the same at 5 fps
        (25, 0.043, 0.0, 4, 1),  # within the slack of one frame interval
        (25, 1.000, 0.0, 4, 4),  # capped
        (25, 0.500, 0.476, 4, 1),  # waiting behind other streams earns no credit
        (25, 0.150, 0.080, 4, 1),  # own 70 ms (a busy CPU) while the worker queues: no growth
        (25, 0.150, 0.030, 4, 3),  # own 120 ms, a short queue: the network, grow
        (0, 0.500, 0.0, 4, 1),  # unknown rate: keep the current limit
    ],
)
def test_resize_follows_the_frames_own_round_trip(
    fps: float, rtt: float, waited: float, cap: int, limit: int
) -> None:
    w = CreditWindow(cap=cap, limit=1, alpha=1.0)
    w.sent(0, 0.0)
    w.completed(0, rtt, waited_s=waited)
    assert w.resize(fps) == limit


@pytest.mark.parametrize(
    ("timings", "waited"),
    [
        ({}, 0.0),
        ({"queue_ms": 30.0, "infer_ms": 20.0, "batch": 1.0}, 0.030),
        ({"queue_ms": 10.0, "infer_ms": 40.0, "batch": 4.0}, 0.040),
    ],
)
def test_waited_counts_queue_and_batch_mates(timings: dict[str, float], waited: float) -> None:
    assert waited_s(timings) == pytest.approx(waited)


def test_a_busy_worker_lets_the_window_shrink_but_not_grow() -> None:
    w = CreditWindow(cap=4, limit=3, alpha=1.0)
    w.sent(0, 0.0)
    w.completed(0, 0.100, waited_s=0.090)  # own 10 ms: one frame covers it
    assert w.worker_busy(25) and w.resize(25) == 1
    w.sent(1, 1.0)
    w.completed(1, 1.0 + 0.200, waited_s=0.0)  # queue gone, 200 ms of network
    assert not w.worker_busy(25) and w.resize(25) == 4


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


def test_take_is_can_send_and_sent_in_one_step() -> None:
    w = CreditWindow(cap=4, limit=2)
    assert w.take(1, 10.0) and w.take(2, 11.0)
    assert not w.take(3, 12.0)  # no credit: nothing taken
    assert w.inflight == {1: 10.0, 2: 11.0} and not w.can_send()
    assert w.completed(1, 10.5) == 0.5
    assert w.can_send() and w.take(3, 12.0)
