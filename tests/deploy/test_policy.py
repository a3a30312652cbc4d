"""Pure policy: schedule windows, placement, scaling targets, cost."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from deploy.cost import CostTotals, PaidPod, accrue, serverless_spend
from deploy.models import StreamSpec, parse_pod_name, pod_name
from deploy.placement import Slot, allowed, place
from deploy.providers.base import GpuPrice
from deploy.scaling import tier_targets
from deploy.schedule import may_run, warm_target
from deploy.settings import OrchestratorSettings, TierConfig, Window
from framerelay.commands.fleet import render

TZ = ZoneInfo("Europe/Paris")
OPEN = Window(start=dt.time(7), end=dt.time(19), min_warm=3)
NIGHT = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20), end=dt.time(6), min_warm=2)


def at(day: int, hour: int, minute: int = 0) -> float:
    return dt.datetime(2026, 3, 2 + day, hour, minute, tzinfo=TZ).timestamp()  # 2 = Monday


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (at(0, 6, 0), 1),  # before the window and its 15 min lead: min_warm
        (at(0, 6, 50), 3),  # within the lead: scaled up ahead
        (at(0, 12), 3),
        (at(0, 19, 0), 1),  # after: back to min_warm (extras drain)
        (at(5, 12), 1),  # Saturday
    ],
)
def test_warm_target_follows_windows_with_lead(t: float, expected: int) -> None:
    tier = TierConfig(name="t", min_warm=1, max_workers=5, windows=(OPEN,), lead_s=900)
    assert warm_target(tier, t, TZ) == expected


@pytest.mark.parametrize(
    ("t", "runs"), [(at(0, 23), True), (at(1, 3), True), (at(1, 12), False), (at(1, 19, 50), True)]
)
def test_batch_only_tier_scales_to_zero_outside_overnight_window(t: float, runs: bool) -> None:
    tier = TierConfig(name="b", batch_only=True, max_workers=4, windows=(NIGHT,), lead_s=900)
    assert may_run(tier, t, TZ) is runs
    assert (warm_target(tier, t, TZ) == 2) is runs


def streams(n: int, priority: str, fps: float = 5) -> list[StreamSpec]:
    return [StreamSpec(id=f"{priority}-{i}", url="x", priority=priority, fps=fps)
            for i in range(n)]  # fmt: skip


def slots() -> list[Slot]:
    return [
        Slot("od-0", "od", False, 16, 0.32),
        Slot("od-1", "od", False, 16, 0.32),
        Slot("spot-0", "spot", True, 16, 0.10),
    ]


def test_critical_never_on_spot_rest_cheapest_bin_packed() -> None:
    result = place(streams(3, "critical") + streams(3, "standard"), slots(), {}, {})
    for sid, worker in result.assign.items():
        assert not (sid.startswith("critical") and worker.startswith("spot"))
    assert [result.assign[f"standard-{i}"] for i in range(3)] == ["spot-0"] * 3
    assert {result.assign[f"critical-{i}"] for i in range(3)} == {"od-0"}  # best fit: packed
    assert not result.unplaced


def test_overflow_and_unplaced() -> None:
    result = place(streams(5, "standard"), slots()[2:], {}, {})
    assert len(result.assign) == 3 and len(result.unplaced) == 2


def test_placement_is_sticky_but_moves_to_cheaper_and_off_dead_workers() -> None:
    current = {"standard-0": "od-1", "critical-0": "od-1", "critical-1": "gone"}
    result = place(streams(2, "critical") + streams(1, "standard"), slots(), current, {})
    assert result.assign["critical-0"] == "od-1"  # stays
    assert result.assign["critical-1"] in {"od-0", "od-1"}  # re-homed
    assert result.assign["standard-0"] == "spot-0"  # cheaper capacity has room
    moves = result.moves(current)
    assert set(moves) == {"critical-1", "standard-0"}


def test_pins_and_batch_only_workers() -> None:
    batch = Slot("b-0", "batch", True, 16, 0.1, batch_only=True)
    work = streams(1, "batch") + streams(1, "standard")
    result = place(work, [*slots(), batch], {}, {}, batch_pinned=True, pins={"standard-0": "od-1"})
    assert result.assign == {"batch-0": "b-0", "standard-0": "od-1"}


def test_scaling_targets_route_demand_by_price_and_policy() -> None:
    settings = OrchestratorSettings(
        tiers=[
            TierConfig(name="od", max_workers=4, capacity_fps=20, min_warm=1),
            TierConfig(name="spot", interruptible=True, max_workers=2, capacity_fps=20,
                       cloud_types=("COMMUNITY",)),
        ],
    )  # fmt: skip
    prices = {"NVIDIA RTX A4000": GpuPrice("NVIDIA RTX A4000", 0.32, 0.2, 0.13, 0.1)}
    work = streams(4, "critical") + streams(10, "standard")  # 20 + 50 fps at 16 per worker
    targets = tier_targets(settings, work, {}, prices, at(0, 12))
    # 3 streams of 5 fps per worker (room 20 x 0.8 = 16): critical needs 2 od workers, the
    # second has room for 2 standard; spot (max 2) takes 6; the last 2 overflow to a third od
    assert targets == {"od": 3, "spot": 2}
    assert tier_targets(settings, [], {}, prices, at(0, 12)) == {"od": 1, "spot": 0}


PRICES = {"NVIDIA RTX A4000": GpuPrice("NVIDIA RTX A4000", 0.32, 0.2, 0.13, 0.1)}


def test_scaling_counts_whole_streams_not_fluid_fps() -> None:
    # 16 x 5 fps = 80 fps = 5 workers of 16 fps in fluid arithmetic, but only 3 whole
    # streams fit one worker: 6 are needed or a stream stays unplaced
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="spot", interruptible=True, max_workers=10, capacity_fps=20)]
    )
    assert tier_targets(settings, streams(16, "standard"), {}, PRICES, at(0, 12)) == {"spot": 6}


def test_scaling_fills_warm_workers_before_opening_new_ones() -> None:
    # all on-demand at one price: the day tier's warm worker and the critical worker's spare
    # room carry standard streams before any overflow worker opens (no idle paid worker)
    day = Window(start=dt.time(7), end=dt.time(19), min_warm=1)
    settings = OrchestratorSettings(
        tiers=[
            TierConfig(name="critical", min_warm=1, max_workers=2, capacity_fps=20),
            TierConfig(name="day", max_workers=6, capacity_fps=20, windows=(day,)),
            TierConfig(name="overflow", max_workers=4, capacity_fps=20),
        ],
    )  # fmt: skip
    work = streams(2, "critical") + streams(16, "standard")  # 18 streams, 3 per worker
    targets = tier_targets(settings, work, {}, PRICES, at(0, 12))
    assert sum(targets.values()) == 6  # the minimum: ceil(18 / 3)
    # equal prices: new workers go to the tier listed first that has room
    assert targets == {"critical": 2, "day": 4, "overflow": 0}


def test_scaling_opens_nothing_for_a_stream_larger_than_a_worker() -> None:
    settings = OrchestratorSettings(tiers=[TierConfig(name="od", max_workers=4, capacity_fps=20)])
    huge = [StreamSpec(id="huge", url="x", fps=30)]
    assert tier_targets(settings, huge, {}, PRICES, at(0, 12)) == {"od": 0}


def test_cost_accrual_and_saving() -> None:
    pods = [PaidPod("od", False, 0.32, 0.32), PaidPod("spot", True, 0.10, 0.32)]
    totals = CostTotals.from_flat(accrue(pods, served_streams=4, dt_s=3600))
    assert totals.fleet_usd == pytest.approx(0.42)
    assert totals.ondemand_equiv_usd == pytest.approx(0.64)
    assert totals.saving == pytest.approx(1 - 0.42 / 0.64)
    assert totals.per_stream_hour_usd == pytest.approx(0.42 / 4)
    assert totals.by_tier_usd == pytest.approx({"od": 0.32, "spot": 0.10})


def test_serverless_spend_is_in_the_fleet_cost_without_a_saving() -> None:
    flat = accrue([PaidPod("od", False, 0.32, 0.32)], served_streams=4, dt_s=3600)
    for k, v in serverless_spend("night", 0.08).items():
        flat[k] = flat.get(k, 0.0) + v
    totals = CostTotals.from_flat(flat)
    assert totals.fleet_usd == pytest.approx(0.40)
    assert totals.serverless_usd == pytest.approx(0.08)
    assert totals.ondemand_equiv_usd == pytest.approx(0.40)  # no saving on an endpoint
    assert totals.by_tier_usd == pytest.approx({"od": 0.32, "night": 0.08})
    assert totals.as_dict()["serverless_usd"] == pytest.approx(0.08)
    assert serverless_spend("night", 0.0) == {} and serverless_spend("night", -1.0) == {}


def test_pod_names_come_from_intent() -> None:
    name = pod_name("fr", "spot-a", 3, 12)
    assert name == "fr-spot-a-3-g12"
    assert parse_pod_name("fr", name) == ("spot-a", 3, 12)
    assert parse_pod_name("other", name) is None and parse_pod_name("fr", "my-pod") is None


@pytest.mark.parametrize(
    "bad",
    [{"tiers": [{"name": "Bad_Name"}]}, {"timezone": "Mars/Base"}, {"fleet": "fr-1"},
     {"tiers": [{"name": "a"}, {"name": "a"}]}, {"nope": 1}],
)  # fmt: skip
def test_settings_refuse_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OrchestratorSettings(**bad)  # type: ignore[arg-type]


def test_fleet_status_names_the_serverless_part_of_the_spend() -> None:
    cost = {"burn_usd_per_hr": 0.1, "fleet_usd": 0.5, "stream_hours": 1.0,
            "cost_per_stream_hour_usd": 0.5, "saving_vs_ondemand": 0.1}  # fmt: skip
    status = {"tiers": [], "pods": [], "unplaced": [], "provider": "local", "leader": "x"}
    assert "serverless" not in render({**status, "cost": cost})  # an older orchestrator
    shown = render({**status, "cost": {**cost, "serverless_usd": 0.25}})
    assert "spent $0.5000 (serverless $0.2500) | 1.000 stream-h" in shown


@pytest.mark.parametrize(
    ("tier", "takes"),
    [
        (TierConfig(name="od"), True),
        (TierConfig(name="community", cloud_types=("COMMUNITY",)), False),
        (TierConfig(name="either", cloud_types=("COMMUNITY", "SECURE")), False),
        (TierConfig(name="spot", interruptible=True), False),
    ],
)
def test_critical_streams_only_on_secure_capacity_that_stays(tier: TierConfig, takes: bool) -> None:
    """Issue 29: with no spot on RunPod, the cheap tier is the community cloud, whose hosts
    fail more often: critical cameras never land there (nor on interruptible capacity)."""
    critical = StreamSpec(id="c", url="rtsp://cam/c", priority="critical", fps=5)
    standard = StreamSpec(id="s", url="rtsp://cam/s", priority="standard", fps=5)
    assert tier.takes_critical is takes
    assert allowed(critical, not tier.takes_critical, batch_only=False) is takes
    assert allowed(standard, not tier.takes_critical, batch_only=False)
