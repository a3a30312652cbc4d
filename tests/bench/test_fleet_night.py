"""``bench/fleet.py --night-only``: a night of batch jobs on RunPod as it is, four ways.

The night is a simulation (the orchestrator's scaler, schedule, placement and cost
functions on a simulated clock), so it runs here in a few seconds: these tests check its
figures' invariants, not any timing. Community pods scaled from zero must cost less than
secure pods scaled the same way, which cost no more than an always-on secure pool; a
serverless endpoint costs less than the always-on pool; every price is the catalog's
(RunPod v2's ``GET /v2/catalog/gpus`` as the contract server serves it); every frame is
processed; only community hosts are lost (RunPod has no spot pods: nothing is
preempted), and only there are frames redone; every plan ends at 0 workers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._fleet_catalog import read_catalog
from bench._fleet_jobs import PLANS, night, night_jobs
from bench.rig.runpod_v2_contract import GPUS
from deploy.providers.base import GpuPrice

ROOT = Path(__file__).resolve().parents[2]
CATALOG = {g.id: g for g in GPUS}
L4 = CATALOG["NVIDIA L4"]
COMMUNITY, SECURE, SERVERLESS, ALWAYS = PLANS
FROM_ZERO = (COMMUNITY, SECURE, SERVERLESS)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/fleet.py", "--night-only", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("night")
    run = _bench("--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "fleet_night.png").is_file()
    return json.loads((out / "fleet_night.json").read_text(encoding="utf-8")), run.stdout


@pytest.fixture(scope="module")
def prices() -> dict[str, GpuPrice]:
    return read_catalog()


def test_the_prices_are_the_catalogs(prices: dict[str, GpuPrice]) -> None:
    assert set(prices) == set(CATALOG)
    for gpu, price in prices.items():
        offer = CATALOG[gpu]
        assert (price.secure, price.community, price.serverless) == (
            offer.secure,
            offer.community,
            offer.serverless,
        )
        assert price.secure_spot is None and price.community_spot is None


def test_community_from_zero_costs_least_and_always_on_most(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, stdout = ran
    plans = out["plans"]
    community, secure, serverless, always = (plans[p] for p in PLANS)
    assert community["usd"] < secure["usd"] <= always["usd"]
    assert serverless["usd"] < always["usd"]
    ratios = out["ratios"]
    assert ratios["community_vs_secure"] == pytest.approx(
        community["usd"] / secure["usd"], abs=1e-4
    )
    assert ratios["community_vs_always_on"] == pytest.approx(
        community["usd"] / always["usd"], abs=1e-4
    )
    assert ratios["serverless_vs_community"] == pytest.approx(
        serverless["usd"] / community["usd"], abs=1e-4
    )
    assert out["always_on_workers"] == secure["peak_pods"] > 0
    assert always["gpu_hours"] >= out["always_on_workers"] * 12  # warm 20:00-08:00
    for key in PLANS:
        assert f"${plans[key]['usd']:7.2f}" in stdout
    assert f"community / always-on {ratios['community_vs_always_on']:.3f}" in stdout


def test_each_plan_pays_the_catalogs_price(ran: tuple[dict[str, Any], str]) -> None:
    out, _ = ran
    plans = out["plans"]
    assert {p["gpu_type"] for p in plans.values()} == {L4.id}  # ranked first by $/fps
    paid = {key: plans[key]["usd_per_gpu_hr"] for key in PLANS}
    wanted = {COMMUNITY: L4.community, SECURE: L4.secure, SERVERLESS: L4.serverless}
    assert paid == {**wanted, ALWAYS: L4.secure}
    for row in plans.values():
        assert row["usd"] == pytest.approx(row["gpu_hours"] * row["usd_per_gpu_hr"], rel=1e-3)
    table = out["prices_usd_per_gpu_hr"]
    assert table == {
        g.id: {"secure": g.secure, "community": g.community, "serverless": g.serverless}
        for g in GPUS
    }


def test_serverless_bills_execution_plus_starts_and_idle_timeouts(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, stdout = ran
    serverless = out["plans"][SERVERLESS]
    assert serverless["execution_usd"] < serverless["usd"]
    assert serverless["execution_hours"] < serverless["gpu_hours"]
    assert serverless["execution_hours"] == out["plans"][SECURE]["execution_hours"]
    assert f"of which execution ${serverless['execution_usd']:.2f}" in stdout
    for key in PLANS:  # the same work everywhere; GPU-hours billed cover it
        assert out["plans"][key]["gpu_hours"] >= out["plans"][key]["execution_hours"]


def test_every_frame_is_processed_and_only_community_hosts_are_lost(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, _ = ran
    total = sum(j["frames"] for j in out["jobs"])
    for key in PLANS:
        row = out["plans"][key]
        assert row["frames_total"] == row["frames_processed"] == total
        assert row["tasks_done"] == row["tasks"]
        assert row["frames_sent"] == row["frames_processed"] + row["redone_frames"]
        assert row["last_job_done"] is not None
    community = out["plans"][COMMUNITY]
    assert community["hosts_lost"] > 0 and community["redone_frames"] > 0
    for key in PLANS[1:]:
        assert out["plans"][key]["hosts_lost"] == out["plans"][key]["redone_frames"] == 0


def test_every_plan_scales_from_zero_and_is_at_zero_at_the_nights_end(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, _ = ran
    for key in PLANS:
        points = out["plans"][key]["pods_over_time"]
        assert out["plans"][key]["pods_at_end"] == 0
        assert points[0][1] == 0 and points[-1][1] == 0, key
        assert [h for h, _ in points] == sorted(h for h, _ in points)
    for key in FROM_ZERO:  # scale to zero: back to 0 between jobs too, not only at the end
        counts = [n for _, n in out["plans"][key]["pods_over_time"]]
        first_up = next(i for i, n in enumerate(counts) if n > 0)
        assert 0 in counts[first_up:-1], key


def test_without_lost_hosts_community_differs_from_secure_by_the_price_alone(
    prices: dict[str, GpuPrice],
) -> None:
    out = night(host_lost_per_pod_h=0.0, prices=prices)
    community, secure = out["plans"][COMMUNITY], out["plans"][SECURE]
    assert community["gpu_hours"] == secure["gpu_hours"]
    assert community["redone_frames"] == community["hosts_lost"] == 0
    assert out["ratios"]["community_vs_secure"] == pytest.approx(L4.community / L4.secure, abs=1e-3)


def test_the_night_is_seeded(prices: dict[str, GpuPrice]) -> None:
    assert night(seed=7, prices=prices) == night(seed=7, prices=prices)
    assert night_jobs(7) != night_jobs(8)
    submitted = [j.submitted_s for j in night_jobs(7)]
    assert submitted == sorted(submitted) and submitted[-1] - submitted[0] == 4 * 3600


@pytest.mark.parametrize("rate", ["nan", "-1", "inf", "11", "lots"])
def test_a_bad_host_loss_rate_is_a_clear_error(rate: str, tmp_path: Path) -> None:
    run = _bench("--host-lost-per-pod-hour", rate, "--out", str(tmp_path))
    assert run.returncode == 2
    assert "community hosts lost per pod-hour in 0..10" in run.stderr
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"0\.\.10"):
        night(host_lost_per_pod_h=math.nan)
