"""Sizing by need: a tier's GPU types ranked by price per unit of measured capacity
for the models it hosts, within their VRAM, each with the reason it ranks there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from bench._fleet_sizing import sizing_day
from bench.rig.runpod_v2_contract import GPUS
from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.models import PodRecord, StreamSpec
from deploy.providers.base import GpuPrice
from deploy.scaling import tier_targets
from deploy.settings import OrchestratorSettings, TierConfig
from deploy.sizing import gpu_order, rank, sizing_report, why_chosen
from tests.support.orchestrator import orch_settings

A4000, A5000, L4 = "NVIDIA RTX A4000", "NVIDIA RTX A5000", "NVIDIA L4"
SEEN = {g.id: GpuPrice(g.id, g.secure, g.community) for g in GPUS}  # as RunPod's catalog says
CATALOG: dict[str, Any] = {
    A4000: {"vram_gb": 16, "capacity_fps": {"yolox_nano": 40, "ppe": 20}},
    L4: {"vram_gb": 24, "capacity_fps": {"yolox_nano": 60, "ppe": 35}},
    A5000: {"vram_gb": 24, "capacity_fps": {"yolox_nano": 50}},  # ppe never measured there
}
SIZING: dict[str, Any] = {
    "gpu_catalog": CATALOG,
    "model_vram_gb": {"yolox_nano": 2, "ppe": 15},
    "model_costs": {"yolox_nano": 1.0, "ppe": 2.0},
}


def _settings(*models: str, gpus: tuple[str, ...] = (A4000, A5000, L4)) -> OrchestratorSettings:
    tier = TierConfig(name="od", gpu_types=gpus, models=models)
    return OrchestratorSettings(tiers=[tier], **SIZING)


def test_types_too_small_for_the_models_are_left_out_and_the_rest_ranked() -> None:
    settings = _settings("yolox_nano", "ppe")  # 17 GB: not on a 16 GB A4000
    tier = settings.tiers[0]
    choices = rank(settings, tier, SEEN)
    assert [c.gpu_type for c in choices] == [L4, A5000, A4000]
    best, unranked, small = choices
    # L4: the slower model bounds it: min(60 x 1.0, 35 x 2.0) = 60 reference fps for $0.43/h
    assert best.capacity_fps == 60 and best.usd_per_fps_hr == pytest.approx(0.43 / 60)
    assert best.reason.startswith("$0.0072 per fps-hour ($0.430/h for 60 fps")
    assert unranked.reason == "no measured capacity for every model: listed order"
    assert not small.fits and small.reason == "left out: 16 GB VRAM < 17 GB for yolox_nano, ppe"
    assert gpu_order(settings, tier, SEEN) == (L4, A5000)  # what the provider tries


def test_the_cheapest_per_unit_of_need_wins_not_the_cheapest_per_hour() -> None:
    settings = _settings("yolox_nano")
    # A4000 is the cheapest per hour (0.32 vs 0.36 and 0.43) but the dearest per fps:
    # L4 0.43 / 60 = 0.00717, A5000 0.36 / 50 = 0.0072, A4000 0.32 / 40 = 0.008
    assert gpu_order(settings, settings.tiers[0], SEEN) == (L4, A5000, A4000)
    dear_l4 = {**SEEN, L4: GpuPrice(L4, 0.60, 0.5, 0.3, 0.2)}  # the provider's price wins
    assert gpu_order(settings, settings.tiers[0], dear_l4) == (A5000, A4000, L4)


def test_list_prices_rank_before_the_provider_reports_any() -> None:
    catalog = {g: {**c, "usd_per_hr": SEEN[g].secure} for g, c in CATALOG.items()}
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="od", gpu_types=(A4000, L4), models=("yolox_nano",))],
        **{**SIZING, "gpu_catalog": catalog},
    )
    report = sizing_report(settings, {})
    assert [row["gpu_type"] for row in report["od"]] == [L4, A4000]
    assert report["od"][0]["usd_per_fps_hr"] == pytest.approx(0.43 / 60, abs=1e-5)


def test_a_tier_without_models_keeps_its_listed_order() -> None:
    settings = _settings()
    assert gpu_order(settings, settings.tiers[0], SEEN) == (A4000, A5000, L4)
    assert why_chosen(settings, "od", A5000, SEEN) == "listed order"


def test_new_pods_try_the_ranked_order_and_say_why(tmp_path: Path) -> None:
    tier = TierConfig(name="od", gpu_types=(A4000, L4), models=("yolox_nano", "ppe"))
    settings = orch_settings(tmp_path, tiers=[tier], **SIZING)
    none = cast(Any, None)
    fleet = Fleet(settings, none, none, none, none, FakeClock(0.0), prices=dict(SEEN))
    rec = PodRecord(name="fr-od-0-g0", tier="od", slot=0, gen=0, spot=False, gpu_type=L4)
    assert fleet._spec(rec).gpu_types == (L4,)
    assert fleet.sizing()["od"][1]["fits"] is False
    reason = why_chosen(settings, "od", L4, fleet.prices)
    assert reason is not None and "per fps-hour" in reason


@pytest.mark.parametrize(
    ("tier", "message"),
    [
        ({"models": ("nosuch",)}, "models ['nosuch'] need their VRAM in model_vram_gb"),
        (
            {"models": ("ppe", "yolox_nano"), "gpu_types": (A4000,)},
            "no GPU type in gpu_types has the 17 GB of VRAM its models take",
        ),
    ],
)
def test_sizing_settings_that_cannot_work_are_refused(tier: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        OrchestratorSettings(tiers=[TierConfig(name="od", **tier)], **SIZING)


def test_the_sizing_day_picks_the_cheaper_type_per_unit_and_says_why() -> None:
    out = sizing_day(step_s=3600)
    assert [row["gpu_type"] for row in out["ranking"]["standard"]] == [L4, A4000]
    assert "per fps-hour" in out["ranking"]["standard"][0]["reason"]
    sized, single = out["sized"], out["single_type"]
    assert set(sized["gpu_types"].values()) == {L4} and set(single["gpu_types"].values()) == {A4000}
    assert (
        sized["stream_hours"] == single["stream_hours"] == out["sized_all_ondemand"]["stream_hours"]
    )
    assert sized["usd_per_stream_hour"] < out["sized_all_ondemand"]["usd_per_stream_hour"]
    assert out["type_saving_all_ondemand"] > 0 and out["saving_vs_single_type"] > 0


def test_the_scaler_uses_the_catalog_capacity_until_workers_measure_their_own() -> None:
    sized = _settings("yolox_nano")  # L4 first: 60 fps of yolox_nano, room 48 at 80 %
    work = [StreamSpec(id=f"s{i}", url="x", fps=5) for i in range(9)]
    noon = 1_772_452_800.0
    assert tier_targets(sized, work, {}, SEEN, noon) == {"od": 1}
    unsized = _settings()  # no models: the default 20 fps (3 streams of 5 fps per worker)
    assert tier_targets(unsized, work, {}, SEEN, noon) == {"od": 3}
