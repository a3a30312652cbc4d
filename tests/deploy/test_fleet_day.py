"""Acceptance: a simulated day on RunPod as it is (schedule, community hosts lost at
10:00, 14:00 and 22:00) through the real fleet logic, the RunPod provider, the v2
contract server and Redis: cost per camera-hour and saving vs all-secure on-demand, with
every price the catalog's, and every stream placed when it may run."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from bench.rig.runpod_v2_contract import GPUS
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration


def _bench() -> Any:
    return importlib.import_module("bench.fleet")


async def test_simulated_day_cost_and_policy() -> None:
    bench = _bench()
    out = await bench.run_day(REDIS_URL, step_s=1200)
    run, base, plans = out["framerelay"], out["all_secure_same_schedule"], out["plans"]
    shown = [
        f"{k} ${p['usd']:.2f} (${p['usd_per_camera_hour']:.4f}/camera-h)" for k, p in plans.items()
    ]
    print(
        f"\nday: {'; '.join(shown)}; critical stream-steps on community pods: "
        f"{run['critical_on_community_steps']}"
    )
    offer = {g.id: g for g in GPUS}[out["gpu_type"]]
    assert out["prices_usd_per_gpu_hr"] == {
        g.id: {"secure": g.secure, "community": g.community, "serverless": g.serverless}
        for g in GPUS
    }
    assert run["hosts_lost"] == 3 and run["events"]["vanished"] == 3
    assert "preempted" not in run["events"] and "vanished" not in base["events"]
    assert run["unplaced_stream_steps"] == 0 and base["unplaced_stream_steps"] == 0
    # critical cameras run on the secure cloud only (community hosts fail more often)
    assert run["critical_on_community_steps"] == 0
    assert run["cost"]["stream_hours"] == pytest.approx(base["cost"]["stream_hours"], rel=0.02)
    # the baselines are not padded: the same-schedule all-secure run rents no more pod-hours
    # than framerelay's, and the static fleet is the fewest workers for the peak (18 streams
    # at 3 per worker)
    assert base["cost"]["pod_hours"] <= run["cost"]["pod_hours"] + 0.5
    assert out["static_all_secure_workers"] == 6
    assert plans["static_all_secure"]["usd"] == pytest.approx(6 * 24 * offer.secure)
    # the community pod-hours are paid at the catalog's community price, the rest at secure
    hours = run["pod_hours_by_cloud"]
    paid = hours["secure"] * offer.secure + hours["community"] * offer.community
    assert run["fleet_usd"] == pytest.approx(paid, rel=1e-3)
    assert base["pod_hours_by_cloud"]["community"] == 0
    usd = {k: p["usd"] for k, p in plans.items()}
    assert usd["framerelay"] < usd["all_secure_same_schedule"] < usd["static_all_secure"]
    assert usd["framerelay"] < usd["framerelay_batch_serverless"]  # steady batch: pods win
    batch = out["batch"]
    serverless = batch["serverless"]
    assert serverless["usd_per_gpu_hr"] == offer.serverless
    assert serverless["usd"] >= serverless["execution_usd"] > 0
    assert batch["community_pods_usd"] < batch["secure_pods_usd"]
    ratios = [r["community_over_secure"] for r in out["price_sensitivity"]]
    savings = [r["saving_vs_all_secure_same_schedule"] for r in out["price_sensitivity"]]
    assert ratios == sorted(ratios) and savings == sorted(savings, reverse=True)
    by_source = {r["source"]: r["community_over_secure"] for r in out["price_sensitivity"]}
    for g in GPUS:
        assert by_source[f"catalog: {g.id}"] == pytest.approx(g.community / g.secure, abs=1e-3)
