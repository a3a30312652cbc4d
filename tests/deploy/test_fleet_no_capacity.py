"""Community-cloud stock gone everywhere: the tier backs off (no create storm, and no
create sent at all: the catalog says there is no stock), on-demand carries its streams
meanwhile, and the community cloud is taken again once it has stock.

The real fleet logic against the RunPod API v2 contract server and a real Redis, with
a fake clock (pods run nothing; health comes from the provider's status)."""

from __future__ import annotations

import datetime as dt
import secrets

import pytest

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import fleet_status
from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.models import StreamSpec
from deploy.settings import TierConfig, Window
from framerelay.commands.fleet import render
from tests.support.contract_fleet import GPU, TICK_S, fleet_on_contract

pytestmark = pytest.mark.integration


def creates(state: ContractServer) -> int:
    return len(state.requests("POST", "/v2/pods"))


async def placement(fleet: Fleet) -> dict[str, str]:
    return {s: p.split("-")[1] for s, p in (await fleet.store.assignments()).items()}


async def test_no_community_stock_falls_back_to_on_demand_then_returns_to_community() -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    state.knobs.no_stock.add((GPU, "COMMUNITY"))
    async with fleet_on_contract(state, clock) as orch:
        fleet = orch.fleet
        for i in range(6):  # 6 x 5 fps: 3 per worker at 80 % of 20 fps
            await fleet.store.put_stream(StreamSpec(id=f"std-{i}", url="rtsp://x", fps=5))
        for _ in range(30):  # 60 s of 2 s passes with no community stock to be had
            await fleet.tick()
            clock.advance(TICK_S)
        # backoff 10, 20, 40, 40 s: 4-5 community attempts in 60 s, not 30
        refused = fleet.counters["no_capacity"]
        assert 3 <= refused <= 5, fleet.counters
        assert creates(state) == 2  # the on-demand ones: none went into no stock
        assert not fleet.unplaced
        on = await placement(fleet)
        assert set(on.values()) == {"ondemand"} and len(on) == 6
        assert len(await fleet.store.pods()) == 2  # ondemand carries all six
        status = await fleet_status(orch)
        community = next(t for t in status["tiers"] if t["name"] == "community")
        assert 0 < community["no_capacity_retry_in_s"] <= 40
        assert "no capacity: next try in" in render(status)

        state.knobs.no_stock.clear()  # community stock is back
        for _ in range(30):
            await fleet.tick()
            clock.advance(TICK_S)
        # the warm on-demand worker is paid for anyway and keeps 3; the other 3 go back to
        # the community cloud (cheaper) and the extra on-demand worker drains
        on = await placement(fleet)
        assert sorted(on.values()) == ["community"] * 3 + ["ondemand"] * 3, on
        pods = await fleet.store.pods()
        assert sorted(p.tier for p in pods.values()) == ["community", "ondemand"]
        assert fleet.counters["terminated_drained"] == 1 and not fleet.unplaced


async def test_batch_workers_warm_up_before_their_window_but_batch_starts_with_it() -> None:
    night = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20), end=dt.time(6), min_warm=1)
    tiers = (
        TierConfig(name="ondemand", min_warm=1, max_workers=2, capacity_fps=20, gpu_types=(GPU,)),
        TierConfig(name="batch", batch_only=True, max_workers=2, capacity_fps=20,
                   gpu_types=(GPU,), cloud_types=("COMMUNITY",), windows=(night,), lead_s=900),
    )  # fmt: skip

    clock = FakeClock(dt.datetime(2026, 3, 2, 19, 50, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, tiers) as orch:
        await orch.store.put_stream(StreamSpec(id="job-0", url="x", priority="batch"))
        await orch.fleet.tick()
        await orch.fleet.tick()
        pods = await orch.store.pods()
        assert sorted(p.tier for p in pods.values()) == ["batch", "ondemand"]  # warm early
        assert await orch.store.assignments() == {}  # 19:50: not yet
        clock.advance(600)  # 20:00
        await orch.fleet.tick()
        assert (await placement(orch.fleet)) == {"job-0": "batch"}
