"""The scaler plans model memory (issue 17): once a tier's workers have said their
model memory budget, a stream whose model fits beside no planned worker's models opens
a pod instead of staying unplaced; a stream whose model fits is planned beside the
others (a load, not a pod); without a budget the plan is by frame rate alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.models import PodRecord, StreamSpec, WorkerModels
from deploy.placement import ModelNeeds
from deploy.providers.base import GpuPrice
from deploy.scaling import TierMemory, tier_memory, tier_targets
from deploy.settings import TierConfig
from tests.support.orchestrator import orch_settings

GPU = "NVIDIA RTX A4000"
PRICES = {GPU: GpuPrice(GPU, 0.32, 0.2, 0.13, 0.1)}
NOON = 1_772_452_800.0
NEEDS = ModelNeeds(vram_mb={"yolox_nano": 256.0, "vehicles": 300.0, "trucks": 300.0,
                            "huge": 5000.0})  # fmt: skip
TIER = {"name": "od", "min_warm": 1, "max_workers": 4, "capacity_fps": 100, "gpu_types": [GPU]}


def _pod(budget_mb: float | None, **tier: Any) -> PodRecord:
    models = None
    if budget_mb is not None:
        models = WorkerModels(budget_mb=budget_mb, loaded={"yolox_nano": 256.0},
                              pinned=("yolox_nano",), default="yolox_nano")  # fmt: skip
    return PodRecord(name="fr-od-0-g0", tier="od", slot=0, gen=0, spot=False, state="running",
                     provider_id="p", cost_per_hr=0.32, ready=True, models=models)  # fmt: skip


def _targets(tmp_path: Path, budget_mb: float | None, *models: str) -> int:
    settings = orch_settings(tmp_path, tiers=[TierConfig(**TIER)])
    streams = [StreamSpec(id=f"s{i}", url="x", fps=5, model=m) for i, m in enumerate(models)]
    pods = {"fr-od-0-g0": _pod(budget_mb)}
    return tier_targets(settings, streams, pods, PRICES, NOON, needs=NEEDS)["od"]


def test_the_tier_memory_is_the_budget_less_the_pinned_models() -> None:
    tier = TierConfig(**TIER)
    assert tier_memory(tier, [_pod(700)]) == TierMemory(444.0, frozenset({"yolox_nano"}))
    assert tier_memory(tier, [_pod(None)]) == TierMemory()  # not said: not planned
    assert tier_memory(tier, [_pod(0)]) == TierMemory()  # no budget


@pytest.mark.parametrize(
    ("budget_mb", "models", "pods"),
    [
        (700, ("vehicles", "trucks"), 2),  # 444 MiB free: one model per worker
        (1000, ("vehicles", "trucks"), 1),  # 744 free: both beside each other
        (700, ("vehicles", "vehicles", "yolox_nano"), 1),  # one load; the default is pinned
        (None, ("vehicles", "trucks"), 1),  # budget unknown: frame rate alone
        (700, ("huge",), 1),  # fits no worker: opens nothing (placement says unplaced)
    ],
)
def test_streams_open_pods_by_model_memory(
    tmp_path: Path, budget_mb: float | None, models: tuple[str, ...], pods: int
) -> None:
    assert _targets(tmp_path, budget_mb, *models) == pods
