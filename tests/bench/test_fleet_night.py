"""``bench/fleet.py --night-only``: a night of batch jobs, three ways (issue 18).

The night is a simulation (the orchestrator's scaler, schedule, placement and cost
functions on a simulated clock), so it runs here in about a second: these tests check
its figures' invariants, not any timing. Spot scaled from zero must cost less than the
same scaling on on-demand, which costs no more than an always-on pool; every frame is
processed; preemptions cost redone frames on spot only; the tier ends at 0 workers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._fleet_jobs import PLANS, night, night_jobs
from bench.rig.runpod_contract import PRICES

ROOT = Path(__file__).resolve().parents[2]
L4 = PRICES["NVIDIA L4"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "bench/fleet.py", "--night-only", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("night")
    run = _bench("--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "fleet_night.png").is_file()
    return json.loads((out / "fleet_night.json").read_text(encoding="utf-8")), run.stdout


def test_spot_from_zero_costs_less_than_on_demand_which_costs_no_more_than_always_on(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, stdout = ran
    spot, ondemand, always = (out["plans"][p] for p in PLANS)
    assert spot["usd"] < ondemand["usd"] <= always["usd"]
    assert out["ratio_spot_vs_ondemand"] == pytest.approx(spot["usd"] / ondemand["usd"], abs=1e-4)
    assert out["ratio_spot_vs_always_on"] == pytest.approx(spot["usd"] / always["usd"], abs=1e-4)
    assert (spot["usd_per_gpu_hr"], ondemand["usd_per_gpu_hr"]) == (L4[3], L4[0])
    for row in (spot, ondemand, always):
        assert row["usd"] == pytest.approx(row["gpu_hours"] * row["usd_per_gpu_hr"], rel=1e-3)
    assert out["always_on_workers"] == ondemand["peak_pods"] > 0
    assert always["gpu_hours"] >= out["always_on_workers"] * 12  # warm 20:00-08:00
    for key in PLANS:
        assert f"${out['plans'][key]['usd']:7.2f}" in stdout
    assert f"always-on {out['ratio_spot_vs_always_on']:.3f}" in stdout


def test_every_frame_is_processed_and_only_spot_redoes_frames(
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
    spot = out["plans"]["spot_scale_to_zero"]
    assert spot["preemptions"] > 0 and spot["redone_frames"] > 0
    for key in PLANS[1:]:
        assert out["plans"][key]["preemptions"] == out["plans"][key]["redone_frames"] == 0


def test_the_tier_scales_from_zero_and_is_at_zero_at_the_nights_end(
    ran: tuple[dict[str, Any], str],
) -> None:
    out, _ = ran
    for key in PLANS:
        points = out["plans"][key]["pods_over_time"]
        assert out["plans"][key]["pods_at_end"] == 0
        assert points[0][1] == 0 and points[-1][1] == 0, key
        assert [h for h, _ in points] == sorted(h for h, _ in points)
    for key in PLANS[:2]:  # scale to zero: back to 0 between jobs too, not only at the end
        counts = [n for _, n in out["plans"][key]["pods_over_time"]]
        first_up = next(i for i, n in enumerate(counts) if n > 0)
        assert 0 in counts[first_up:-1], key


def test_without_preemptions_spot_differs_from_on_demand_by_the_price_alone() -> None:
    out = night(preempt_per_pod_h=0.0)
    spot, ondemand = out["plans"]["spot_scale_to_zero"], out["plans"]["ondemand_scale_to_zero"]
    assert spot["gpu_hours"] == ondemand["gpu_hours"]
    assert spot["redone_frames"] == 0
    assert out["ratio_spot_vs_ondemand"] == pytest.approx(L4[3] / L4[0], abs=1e-3)


def test_the_night_is_seeded() -> None:
    assert night(seed=7) == night(seed=7)
    assert night_jobs(7) != night_jobs(8)
    submitted = [j.submitted_s for j in night_jobs(7)]
    assert submitted == sorted(submitted) and submitted[-1] - submitted[0] == 4 * 3600


@pytest.mark.parametrize("rate", ["nan", "-1", "inf", "11", "lots"])
def test_a_bad_preemption_rate_is_a_clear_error(rate: str, tmp_path: Path) -> None:
    run = _bench("--preempt-per-pod-hour", rate, "--out", str(tmp_path))
    assert run.returncode == 2
    assert "preemptions per pod-hour in 0..10" in run.stderr
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"0\.\.10"):
        night(preempt_per_pod_h=math.nan)
