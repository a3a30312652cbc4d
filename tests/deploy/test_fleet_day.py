"""Acceptance 4: a simulated day (schedule + 3 spot preemptions) through the real
fleet logic, RunPod contract server and Redis: cost and saving vs on-demand,
every stream placed when it may run, no critical stream ever on spot."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.deploy.orch_support import REDIS_URL

pytestmark = pytest.mark.integration


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_fleet", ROOT / "bench" / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simulated_day_cost_and_policy() -> None:
    # raises if a critical stream ever ran on spot
    out = asyncio.run(_bench().run_day(REDIS_URL, step_s=1200))
    spot, base = out["spot"], out["ondemand_same_schedule"]
    print(
        f"\nday: fleet ${spot['fleet_usd']:.2f} (spot) vs ${base['fleet_usd']:.2f} (same schedule, "
        f"all on-demand) vs ${out['ondemand_always_on_usd']:.2f} (always-on peak on-demand); "
        f"saving {out['saving_vs_ondemand_same_schedule']:.1%} / "
        f"{out['saving_vs_ondemand_always_on']:.1%}; "
        f"${spot['cost']['cost_per_stream_hour_usd']:.4f}/stream-h"
    )
    assert spot["preemptions"] == 3 and spot["events"]["preempted"] == 3
    assert spot["unplaced_stream_steps"] == 0 and base["unplaced_stream_steps"] == 0
    assert spot["cost"]["stream_hours"] == pytest.approx(base["cost"]["stream_hours"], rel=0.02)
    # the baselines are not padded: the same-schedule on-demand run rents no more pod-hours
    # than the spot run, and the static fleet is the fewest workers for the peak (18 streams
    # at 3 per worker)
    assert base["cost"]["pod_hours"] <= spot["cost"]["pod_hours"] + 0.5
    assert out["ondemand_always_on_workers"] == 6
    assert out["saving_vs_ondemand_same_schedule"] > 0.5
    assert out["saving_vs_ondemand_always_on"] >= 0.6
    ratios = [r["spot_ratio"] for r in out["price_sensitivity"]]
    savings = [r["saving_vs_ondemand_always_on"] for r in out["price_sensitivity"]]
    assert ratios == sorted(ratios) and savings == sorted(savings, reverse=True)
