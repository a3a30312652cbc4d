"""Sizing by need over a day: two models, two GPU types, which type and what it costs.

The fleet's tiers host two models (``yolox_nano``, a light detector, and
``ppe``, a heavier one weighing 2x per frame). ``deploy.sizing`` ranks the
tiers' two GPU types by price per unit of measured capacity for those models
within their VRAM and prints why; the day is then packed step by step with
the scaler's own code (``deploy.scaling.plan_workers``: whole streams per
worker, critical never on spot) on the chosen type, and priced:

* ``sized``: framerelay - the ranked first GPU type, standard streams on spot;
* ``sized_all_ondemand``: the same GPU type, every tier on-demand;
* ``single_type``: every tier on-demand on one fixed GPU type (the one a fleet
  sized by price per hour alone would rent: the cheapest per hour).

``saving_vs_single_type`` is framerelay's whole saving against that fleet;
``type_saving_all_ondemand`` the part the GPU type alone brings (both on-demand).

The catalog's capacities and VRAM are illustrative orders of magnitude (measure
yours with ``bench/gpu.py`` on each GPU type); prices are the contract server's.
Imported by ``bench/fleet.py``; pure computation, no server.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

from bench.rig.runpod_contract import PRICES
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
SEEN = {g: GpuPrice(g, *p) for g, p in PRICES.items()}
TZ = ZoneInfo("Europe/Paris")


def _streams(kind: str, model: str, n: int, priority: str) -> list[StreamSpec]:
    return [
        StreamSpec(id=f"{kind}-{i}", url=f"rtsp://cam/{kind}/{i}", priority=priority, fps=5,
                   model=model)
        for i in range(n)
    ]  # fmt: skip


CRITICAL = _streams("gate", "yolox_nano", 2, "critical")
STANDARD = _streams("aisle", "yolox_nano", 10, "standard") + _streams("ppe", "ppe", 6, "standard")


def fleet_settings(spot: bool, gpu_types: tuple[str, ...] = (A4000, L4)) -> OrchestratorSettings:
    common: dict[str, Any] = {"gpu_types": gpu_types, "models": MODELS, "max_workers": 50}
    return OrchestratorSettings(
        tiers=[
            TierConfig(name="critical", **common),
            TierConfig(name="standard", spot=spot, cloud_types=("COMMUNITY",) if spot else
                       ("SECURE",), **common),
        ], **SIZING,
    )  # fmt: skip


def _chosen(settings: OrchestratorSettings, tier: TierConfig) -> tuple[str, float, float]:
    """(GPU type, $/h, reference fps) of the tier's first-ranked type."""
    best = rank(settings, tier, SEEN)[0]
    assert best.usd_per_hr is not None and best.capacity_fps is not None
    return best.gpu_type, best.usd_per_hr, best.capacity_fps


def price_day(settings: OrchestratorSettings, step_s: float) -> dict[str, Any]:
    """Pack every step's streams with the scaler and price the pod-hours."""
    chosen = {t.name: _chosen(settings, t) for t in settings.tiers}
    capacity = {name: fps for name, (_, _, fps) in chosen.items()}
    prices = {gpu: SEEN[gpu] for gpu, _, _ in chosen.values()}
    start = dt.datetime(2026, 3, 2, tzinfo=TZ)  # a Monday
    usd = stream_h = 0.0
    for i in range(int(24 * 3600 / step_s)):
        local = start + dt.timedelta(seconds=i * step_s)
        opened = dt.time(7) <= local.time() < dt.time(19)
        running = CRITICAL + (STANDARD if opened else [])
        plan = plan_workers(
            settings, running, capacity, prices, {t.name: 0 for t in settings.tiers}
        )
        usd += sum(n * chosen[t][1] for t, n in plan.items()) * step_s / 3600
        stream_h += len(running) * step_s / 3600
    return {
        "gpu_types": {t: g for t, (g, _, _) in chosen.items()},
        "usd": round(usd, 4),
        "stream_hours": round(stream_h, 2),
        "usd_per_stream_hour": round(usd / stream_h, 5),
    }


def sizing_day(step_s: float = 600.0) -> dict[str, Any]:
    """The ranking (with reasons) and the day's cost per stream-hour, three ways."""
    sized = fleet_settings(spot=True)
    cheapest_per_hour = min((A4000, L4), key=lambda g: SEEN[g].ondemand)
    out = {
        "ranking": {t.name: [c.as_dict() for c in rank(sized, t, SEEN)] for t in sized.tiers},
        "sized": price_day(sized, step_s),
        "sized_all_ondemand": price_day(fleet_settings(spot=False), step_s),
        "single_type": price_day(fleet_settings(False, (cheapest_per_hour,)), step_s),
    }
    base = out["sized_all_ondemand"]["usd"]
    for key in ("sized", "single_type"):
        out[key]["saving_vs_sized_all_ondemand"] = round(1 - out[key]["usd"] / base, 4)
    single = out["single_type"]["usd"]
    out["saving_vs_single_type"] = round(1 - out["sized"]["usd"] / single, 4)
    out["type_saving_all_ondemand"] = round(1 - base / single, 4)
    return out


def report(out: dict[str, Any]) -> None:
    print("sizing by need: two models (yolox_nano, ppe x2), GPU types ranked per tier")
    for tier, rows in out["ranking"].items():
        for k, row in enumerate(rows):
            mark = "chosen" if k == 0 else f"#{k + 1}   "
            print(f"  {tier:9s} {mark} {row['gpu_type']:17s} {row['reason']}")
    for key in ("sized", "sized_all_ondemand", "single_type"):
        row = out[key]
        gpus = ", ".join(sorted(set(row["gpu_types"].values())))
        print(f"  {key:19s} on {gpus:17s} ${row['usd']:7.2f}/day  "
              f"${row['usd_per_stream_hour']:.4f}/stream-h")  # fmt: skip
    print(f"  vs one GPU type chosen by $/h alone, all on-demand: sized "
          f"{100 * out['saving_vs_single_type']:.1f} % cheaper (the GPU type alone: "
          f"{100 * out['type_saving_all_ondemand']:.1f} %)")  # fmt: skip
