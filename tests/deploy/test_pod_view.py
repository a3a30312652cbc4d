"""Issue 15: the orchestrator's pod view (``GET /v1/pods``, ``/v1/fleet``) says each pod's
last canary round trip and uptime, which the console's fleet panel shows. The real fleet
logic against the RunPod API v2 contract server and a real Redis, with a fake clock."""

from __future__ import annotations

import datetime as dt
import secrets

import httpx
import pytest

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import create_app
from deploy.clock import FakeClock
from tests.support.auth import mint
from tests.support.contract_fleet import (
    CANARY_MS,
    GPU,
    TICK_S,
    WARM_TIERS,
    TimedProber,
    fleet_on_contract,
    passes,
)
from tests.support.orchestrator import serving_here

pytestmark = pytest.mark.integration


async def test_pods_show_their_canary_round_trip_and_uptime() -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, WARM_TIERS) as orch:
        orch.fleet.prober = TimedProber()
        await passes(orch, clock, 3)  # the warm on-demand pod: created at 0 s, now 6 s
        async with serving_here(create_app(orch)) as url, httpx.AsyncClient() as http:
            token = mint(orch.keys, ["fleet:read"], "orchestrator")
            resp = await http.get(url + "/v1/pods", headers={"Authorization": f"Bearer {token}"})
            pods: list[dict[str, object]] = resp.json()

    (pod,) = pods
    assert pod["ready"] and pod["gpu_type"] == GPU
    assert pod["canary_ms"] == CANARY_MS and pod["uptime_s"] == 3 * TICK_S
    assert "fails" not in pod and "last_canary" not in pod
