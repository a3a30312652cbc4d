"""FleetHistory and EventLog: an hour of cost and fleet size, and a bounded event log, in
fixed memory, with a fake clock."""

from __future__ import annotations

import math

import pytest

from deploy.clock import FakeClock
from deploy.events import EventLog
from deploy.history import FleetHistory
from deploy.models import PodRecord
from deploy.workers import move_reason


def pod(
    name: str, tier: str, usd: float, *, billed: bool = True, ondemand: float = 0.0
) -> PodRecord:
    return PodRecord(name=name, tier=tier, slot=0, gen=0, spot=tier == "spot",
                     provider_id=f"id-{name}" if billed else None, cost_per_hr=usd,
                     ondemand_per_hr=ondemand)  # fmt: skip


def test_ten_thousand_samples_leave_exactly_360_points() -> None:
    history, clock = FleetHistory(["ondemand", "spot"]), FakeClock(1_800_000_000)
    pods = {"a": pod("a", "ondemand", 0.5)}
    times = []
    for _ in range(10_000):
        clock.advance(10)
        times.append(clock.now())
        history.sample(clock.now(), pods, {"cam": "a"})
    view = history.read()
    assert len(history) == 360 and view.timestamps == times[-360:]
    assert view.usd_per_hour == [0.5] * 360 and view.pods["spot"] == [0.0] * 360


def test_one_point_cost_per_stream_hour_and_pods_by_tier() -> None:
    history = FleetHistory(["ondemand", "spot"])
    pods = {
        "a": pod("a", "ondemand", 0.6),
        "b": pod("b", "spot", 0.2, ondemand=0.6),
        "c": pod("c", "spot", 0.2, billed=False),  # an intent: not billed yet
    }
    history.sample(10.0, pods, {"s1": "a", "s2": "b", "s3": "b", "s4": "gone"})
    view = history.read()
    assert view.usd_per_hour == [0.8] and view.ondemand_usd_per_hour == [1.2]
    assert view.streams_placed == [3.0] and view.usd_per_stream_hour == [pytest.approx(0.266667)]
    assert view.pods == {"ondemand": [1.0], "spot": [1.0]}
    history.sample(20.0, {}, {})
    assert history.read().usd_per_stream_hour[-1] is None  # nothing placed: no ratio


def test_a_point_is_due_every_interval() -> None:
    history = FleetHistory(["t"], interval_s=10)
    assert history.due(0.0)
    history.sample(100.0, {}, {})
    assert not history.due(109.9) and history.due(110.0)


@pytest.mark.parametrize("kwargs", [{"points": 0}, {"interval_s": 0.0}, {"interval_s": math.nan}])
def test_bad_sizes_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="history needs"):
        FleetHistory(["t"], **kwargs)  # type: ignore[arg-type]


def test_the_event_log_is_bounded_and_ordered() -> None:
    log = EventLog(size=500)
    for i in range(10_000):
        log.record(float(i), "created", f"p-{i}", "tier needs 1 workers")
    assert len(log) == 500 and log[0]["seq"] == 9_501 and log[-1]["t"] == 9_999.0
    assert [e["seq"] for e in log.since(9_997.0)] == [9_999, 10_000]
    assert len(log.since(None)) == 500 and log.since(1e12) == []


def test_an_event_has_time_kind_pod_stream_and_reason() -> None:
    log = EventLog()
    event = log.record(5.0, "moved", "w2", "re-homed: worker w1 is lost or not ready", "cam",
                       old="w1", new="w2")  # fmt: skip
    assert event == {"seq": 1, "t": 5.0, "kind": "moved", "pod": "w2", "stream": "cam",
                     "reason": "re-homed: worker w1 is lost or not ready", "old": "w1",
                     "new": "w2"}  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "pin", "says"),
    [
        (None, "w1", None, "placed"),
        ("w1", None, None, "unplaced"),
        ("lost", "w1", None, "worker lost is lost or not ready: re-homed on w1"),
        ("lost", None, None, "worker lost is lost or not ready: no other"),
        ("w1", "w2", "w2", "operator"),
        ("w1", "w2", None, "cheaper"),
    ],
)
def test_move_reasons(old: str | None, new: str | None, pin: str | None, says: str) -> None:
    assert says in move_reason(old, new, {"w1", "w2"}, pin)
