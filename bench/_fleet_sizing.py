"""Sizing by need over a day: two models, two GPU types, which type and what it costs.

The fleet's tiers host two models (``yolox_nano``, a light detector, and
``ppe``, a heavier one weighing 2x per frame). ``deploy.sizing`` ranks the
tiers' two GPU types by price per unit of measured capacity for those models
within their VRAM and prints why; the day is then packed step by step with
the scaler's own code (``deploy.scaling.plan_workers``: whole streams per
worker) on the chosen type, and priced:

* ``sized``: framerelay - the ranked first GPU type, critical cameras on the secure
  cloud, standard ones on RunPod's community cloud (its cheaper capacity);
* ``sized_all_ondemand``: the same GPU type, every tier on the secure cloud (the
  on-demand reference price);
* ``single_type``: every tier on the secure cloud on one fixed GPU type (the one a
  fleet sized by price per hour alone would rent: the cheapest per hour).

``saving_vs_single_type`` is framerelay's whole saving against that fleet;
``type_saving_all_ondemand`` the part the GPU type alone brings (both all secure).

The catalog's capacities and VRAM are illustrative orders of magnitude (measure
yours with ``bench/gpu.py`` on each GPU type); prices are RunPod's catalog as the v2
contract server lists them (:mod:`bench._fleet_catalog`).
Imported by ``bench/fleet.py``; pure computation, no server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from bench._fleet_catalog import read_catalog
from deploy.models import StreamSpec
from deploy.providers.base import GpuPrice
from deploy.scaling import plan_workers
from deploy.settings import OrchestratorSettings, TierConfig
from deploy.sizing import rank

A4000, L4 = "NVIDIA RTX A4000", "NVIDIA L4"
MODELS = ("yolox_nano", "ppe")
SIZING: dict[str, Any] = {
    "gpu_catalog": {
        A4000: {"vram_gb": 16, "capacity_fps": {"yolox_nano": 40, "ppe": 18}},
        L4: {"vram_gb": 24, "capacity_fps": {"yolox_nano": 70, "ppe": 35}},
    },
    "model_vram_gb": {"yolox_nano": 2, "ppe": 6},
    "model_costs": {"yolox_nano": 1.0, "ppe": 2.0},
}
TZ = ZoneInfo("Europe/Paris")
Prices = Mapping[str, GpuPrice]


def _streams(kind: str, model: str, n: int, priority: str) -> list[StreamSpec]:
    return [
        StreamSpec(
            id=f"{kind}-{i}", url=f"rtsp://cam/{kind}/{i}", priority=priority, fps=5, model=model
        )
        for i in range(n)
    ]


CRITICAL = _streams("gate", "yolox_nano", 2, "critical")
STANDARD = _streams("aisle", "yolox_nano", 10, "standard") + _streams("ppe", "ppe", 6, "standard")


def fleet_settings(
    community: bool, gpu_types: tuple[str, ...] = (A4000, L4)
) -> OrchestratorSettings:
    """Critical on the secure cloud (one worker warm all day, the first the scaler fills);
    standard on the community cloud, or secure."""
    common: dict[str, Any] = {"gpu_types": gpu_types, "models": MODELS, "max_workers": 50}
    cloud = ("COMMUNITY",) if community else ("SECURE",)
    return OrchestratorSettings(
        tiers=[
            TierConfig(name="critical", min_warm=1, **common),
            TierConfig(name="standard", cloud_types=cloud, **common),
        ],
        **SIZING,
    )


def _chosen(
    settings: OrchestratorSettings, tier: TierConfig, prices: Prices
) -> tuple[str, float, float]:
    """(GPU type, $/h, reference fps) of the tier's first-ranked type."""
    best = rank(settings, tier, prices)[0]
    if best.usd_per_hr is None or best.capacity_fps is None:
        raise RuntimeError(f"tier {tier.name}: {best.gpu_type} has no price or capacity")
    return best.gpu_type, best.usd_per_hr, best.capacity_fps


def price_day(settings: OrchestratorSettings, step_s: float, prices: Prices) -> dict[str, Any]:
    """Pack every step's streams with the scaler and price the pod-hours."""
    chosen = {t.name: _chosen(settings, t, prices) for t in settings.tiers}
    capacity = {name: fps for name, (_, _, fps) in chosen.items()}
    start = dt.datetime(2026, 3, 2, tzinfo=TZ)  # a Monday
    usd = stream_h = 0.0
    for i in range(int(24 * 3600 / step_s)):
        local = start + dt.timedelta(seconds=i * step_s)
        opened = dt.time(7) <= local.time() < dt.time(19)
        running = CRITICAL + (STANDARD if opened else [])
        warm = {t.name: t.min_warm for t in settings.tiers}
        plan = plan_workers(settings, running, capacity, prices, warm)
        usd += sum(n * chosen[t][1] for t, n in plan.items()) * step_s / 3600
        stream_h += len(running) * step_s / 3600
    return {
        "gpu_types": {t: g for t, (g, _, _) in chosen.items()},
        "usd_per_gpu_hr": {t: usd_hr for t, (_, usd_hr, _) in chosen.items()},
        "usd": round(usd, 4),
        "stream_hours": round(stream_h, 2),
        "usd_per_stream_hour": round(usd / stream_h, 5),
    }


def sizing_day(step_s: float = 600.0, prices: Prices | None = None) -> dict[str, Any]:
    """The ranking (with reasons) and the day's cost per stream-hour, three ways;
    ``prices``: RunPod's catalog (read through the provider when not given)."""
    seen = dict(prices) if prices is not None else read_catalog()
    sized = fleet_settings(community=True)
    cheapest_per_hour = min((A4000, L4), key=lambda g: seen[g].secure)
    out = {
        "ranking": {t.name: [c.as_dict() for c in rank(sized, t, seen)] for t in sized.tiers},
        "sized": price_day(sized, step_s, seen),
        "sized_all_ondemand": price_day(fleet_settings(community=False), step_s, seen),
        "single_type": price_day(fleet_settings(False, (cheapest_per_hour,)), step_s, seen),
    }
    base = out["sized_all_ondemand"]["usd"]
    for key in ("sized", "single_type"):
        out[key]["saving_vs_sized_all_ondemand"] = round(1 - out[key]["usd"] / base, 4)
    single = out["single_type"]["usd"]
    out["saving_vs_single_type"] = round(1 - out["sized"]["usd"] / single, 4)
    out["type_saving_all_ondemand"] = round(1 - base / single, 4)
    return out


LABELS = {
    "sized": "sized, standard on community",
    "sized_all_ondemand": "sized, all secure",
    "single_type": "one type by $/h, all secure",
}


def report(out: dict[str, Any]) -> None:
    print("sizing by need: two models (yolox_nano, ppe x2), GPU types ranked per tier")
    for tier, rows in out["ranking"].items():
        for k, row in enumerate(rows):
            mark = "chosen" if k == 0 else f"#{k + 1}   "
            print(f"  {tier:9s} {mark} {row['gpu_type']:17s} {row['reason']}")
    for key, label in LABELS.items():
        row = out[key]
        gpus = ", ".join(sorted(set(row["gpu_types"].values())))
        print(
            f"  {label:29s} on {gpus:17s} ${row['usd']:7.2f}/day  "
            f"${row['usd_per_stream_hour']:.4f}/stream-h"
        )
    print(
        f"  vs one GPU type chosen by $/h alone, all secure: sized "
        f"{100 * out['saving_vs_single_type']:.1f} % cheaper (the GPU type alone: "
        f"{100 * out['type_saving_all_ondemand']:.1f} %)"
    )
