"""Spot capacity gone everywhere: the tier backs off (no create storm), on-demand
carries its streams meanwhile, and spot is taken again once it is back.

The real fleet logic against the RunPod contract server and a real Redis, with
a fake clock (pods run nothing; health comes from the provider's status)."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from bench.rig.runpod_contract import ContractState, running_contract_server
from deploy.api import fleet_status
from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.models import StreamSpec
from deploy.providers.runpod import RunPodProvider
from deploy.service import Orchestrator
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig, Window
from framerelay.commands.fleet import render
from tests.support.auth import ed_keys

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A4000"
TICK_S = 2.0


TIERS = (
    TierConfig(name="ondemand", min_warm=1, max_workers=4, capacity_fps=20, gpu_types=(GPU,)),
    TierConfig(name="spot", spot=True, max_workers=4, capacity_fps=20, gpu_types=(GPU,),
               cloud_types=("COMMUNITY",)),
)  # fmt: skip


@asynccontextmanager
async def fleet_on_contract(
    state: ContractState, clock: FakeClock, tiers: tuple[TierConfig, ...] = TIERS
) -> AsyncIterator[Orchestrator]:
    ca_dir = tempfile.TemporaryDirectory(prefix="framerelay-ca-test-")
    settings = OrchestratorSettings(
        provider="runpod", tiers=list(tiers), key_prefix=f"test-nocap-{state.api_key}:",
        signing_keys=SecretStr(ed_keys().to_json()), ca_dir=Path(ca_dir.name) / "ca",
        tick_s=TICK_S, create_backoff_s=10, timezone="UTC", create_backoff_max_s=40,
        drain_timeout_s=0,
    )  # fmt: skip
    with ca_dir, running_contract_server(state) as base:
        provider = RunPodProvider(
            RunPodSettings(api_key=SecretStr(state.api_key), base_url=base, backoff_s=0.01)
        )
        orch = Orchestrator(
            settings, provider=provider, prober=StatusProber(20), ingest=NullIngestLink(),
            clock=clock, redis=Redis.from_url("redis://127.0.0.1:6379/0"),
        )  # fmt: skip
        try:
            yield orch
        finally:
            await orch.store.clear()
            await orch.aclose()


def spot_posts(state: ContractState) -> int:
    return sum(1 for m, p in state.requests if m == "POST" and p == "/v1/pods")


async def placement(fleet: Fleet) -> dict[str, str]:
    return {s: p.split("-")[1] for s, p in (await fleet.store.assignments()).items()}


def test_no_spot_capacity_falls_back_to_on_demand_then_returns_to_spot() -> None:
    async def main() -> None:
        clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
        state = ContractState("rpa_" + secrets.token_hex(12), clock=clock.now)
        state.faults.no_capacity.add((GPU, "COMMUNITY"))
        async with fleet_on_contract(state, clock) as orch:
            fleet = orch.fleet
            for i in range(6):  # 6 x 5 fps: 3 per worker at 80 % of 20 fps
                await fleet.store.put_stream(StreamSpec(id=f"std-{i}", url="rtsp://x", fps=5))
            for _ in range(30):  # 60 s of 2 s passes with no spot to be had
                await fleet.tick()
                clock.advance(TICK_S)
            # backoff 10, 20, 40, 40 s: 4-5 spot attempts in 60 s, not 30
            refused = fleet.counters["no_capacity"]
            assert 3 <= refused <= 5, fleet.counters
            assert not fleet.unplaced
            on = await placement(fleet)
            assert set(on.values()) == {"ondemand"} and len(on) == 6
            assert len(await fleet.store.pods()) == 2  # ondemand carries all six
            status = await fleet_status(orch)
            spot = next(t for t in status["tiers"] if t["name"] == "spot")
            assert 0 < spot["no_capacity_retry_in_s"] <= 40
            assert "no capacity: next try in" in render(status)

            state.faults.no_capacity.clear()  # spot is back
            for _ in range(30):
                await fleet.tick()
                clock.advance(TICK_S)
            # the warm on-demand worker is paid for anyway and keeps 3; the other 3 go back to
            # spot (cheaper) and the extra on-demand worker drains
            on = await placement(fleet)
            assert sorted(on.values()) == ["ondemand"] * 3 + ["spot"] * 3, on
            pods = await fleet.store.pods()
            assert sorted(p.tier for p in pods.values()) == ["ondemand", "spot"]
            assert fleet.counters["terminated_drained"] == 1 and not fleet.unplaced

    asyncio.run(main())


def test_batch_workers_warm_up_before_their_window_but_batch_starts_with_it() -> None:
    night = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20), end=dt.time(6), min_warm=1)
    tiers = (
        TierConfig(name="ondemand", min_warm=1, max_workers=2, capacity_fps=20, gpu_types=(GPU,)),
        TierConfig(name="batch", spot=True, batch_only=True, max_workers=2, capacity_fps=20,
                   gpu_types=(GPU,), cloud_types=("COMMUNITY",), windows=(night,), lead_s=900),
    )  # fmt: skip

    async def main() -> None:
        clock = FakeClock(dt.datetime(2026, 3, 2, 19, 50, tzinfo=dt.UTC))
        state = ContractState("rpa_" + secrets.token_hex(12), clock=clock.now)
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

    asyncio.run(main())
