"""Sizing by need: which of a tier's GPU types to rent first, and why.

A tier that names the ``models`` it must host is sized from the GPU catalog
(``gpu_catalog``: per GPU type its VRAM and the capacity measured for each model
on one GPU, e.g. with ``bench/gpu.py``) and the models' VRAM needs
(``model_vram_gb``):

* a GPU type whose VRAM cannot hold every model of the tier at once is left out;
* the others are ranked by price per unit of capacity: $/h of one GPU (the
  provider's price when it reported one, else the catalog's list price) divided
  by the reference-model fps it promises for the tier's models - the least over
  the models of ``capacity_fps[model] x model_costs[model]`` (demand is counted
  in reference-model fps, and the slowest model bounds what a GPU can promise);
* types the catalog cannot rank (no price or no measured capacity) keep their
  listed order after the ranked ones.

The provider walks the result in order (then cloud types, data centres), so the
cheapest GPU per unit of need is tried first; each choice carries the reason the
fleet report (``GET /v1/fleet``'s tiers, ``created`` events, ``bench/fleet.py``)
shows. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from deploy.providers.base import GpuPrice
from deploy.settings import GpuTypeConfig, OrchestratorSettings, TierConfig


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """One GPU type of a tier, as sizing judged it."""

    gpu_type: str
    usd_per_hr: float | None
    capacity_fps: float | None
    """Reference-model fps one GPU of this type promises for the tier's models."""
    vram_gb: float | None
    need_gb: float
    fits: bool
    reason: str

    @property
    def usd_per_fps_hr(self) -> float:
        """$ per hour per fps of capacity (inf when unknown)."""
        if self.usd_per_hr is None or not self.capacity_fps:
            return math.inf
        return self.usd_per_hr / self.capacity_fps

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        unit = self.usd_per_fps_hr
        out["usd_per_fps_hr"] = round(unit, 5) if math.isfinite(unit) else None
        return out


def vram_need(settings: OrchestratorSettings, tier: TierConfig) -> float:
    """GB of VRAM the tier's models take, all loaded at once."""
    return sum(settings.model_vram_gb.get(m, 0.0) for m in tier.models)


def _price(
    gpu: str, tier: TierConfig, cfg: GpuTypeConfig | None, prices: Mapping[str, GpuPrice]
) -> float | None:
    seen = prices.get(gpu)
    if seen is not None:
        usd = seen.price(tier.cloud_types[0], tier.interruptible)
        if usd > 0:
            return usd
    if cfg is None:
        return None
    return cfg.interruptible_usd_per_hr if tier.interruptible else cfg.usd_per_hr


def _capacity(settings: OrchestratorSettings, tier: TierConfig, cfg: GpuTypeConfig) -> float | None:
    per_model = [
        cfg.capacity_fps[m] * settings.model_costs.get(m, 1.0)
        for m in tier.models
        if m in cfg.capacity_fps
    ]
    return min(per_model) if per_model and len(per_model) == len(tier.models) else None


def judge(
    settings: OrchestratorSettings, tier: TierConfig, gpu: str, prices: Mapping[str, GpuPrice]
) -> GpuChoice:
    """One GPU type for one tier: does it fit, what it costs per unit of capacity."""
    cfg = settings.gpu_catalog.get(gpu)
    need = vram_need(settings, tier)
    usd = _price(gpu, tier, cfg, prices)
    if cfg is None:
        return GpuChoice(gpu, usd, None, None, need, True, "not in gpu_catalog: listed order")
    cap = _capacity(settings, tier, cfg)
    if cfg.vram_gb < need:
        why = f"left out: {cfg.vram_gb:g} GB VRAM < {need:g} GB for {', '.join(tier.models)}"
        return GpuChoice(gpu, usd, cap, cfg.vram_gb, need, False, why)
    if cap is None or usd is None:
        what = "no price" if usd is None else "no measured capacity for every model"
        return GpuChoice(gpu, usd, cap, cfg.vram_gb, need, True, f"{what}: listed order")
    why = (
        f"${usd / cap:.4f} per fps-hour (${usd:.3f}/h for {cap:g} fps of the tier's models; "
        f"{cfg.vram_gb:g} GB VRAM >= {need:g} GB)"
    )
    return GpuChoice(gpu, usd, cap, cfg.vram_gb, need, True, why)


def rank(
    settings: OrchestratorSettings, tier: TierConfig, prices: Mapping[str, GpuPrice]
) -> list[GpuChoice]:
    """The tier's GPU types, best first: ranked ones by $/fps-hour, then the unranked in
    listed order, then (not to be rented) those too small. A tier without ``models``
    keeps its listed order."""
    choices = [judge(settings, tier, g, prices) for g in tier.gpu_types]
    if not tier.models:
        return [
            GpuChoice(c.gpu_type, c.usd_per_hr, None, c.vram_gb, 0.0, True, "listed order")
            for c in choices
        ]
    order = {c.gpu_type: i for i, c in enumerate(choices)}
    return sorted(
        choices,
        key=lambda c: (not c.fits, not math.isfinite(c.usd_per_fps_hr), c.usd_per_fps_hr,
                       order[c.gpu_type]),
    )  # fmt: skip


def gpu_order(
    settings: OrchestratorSettings, tier: TierConfig, prices: Mapping[str, GpuPrice]
) -> tuple[str, ...]:
    """The GPU types to try, in order (those whose VRAM is too small left out)."""
    return tuple(c.gpu_type for c in rank(settings, tier, prices) if c.fits)


def sizing_report(
    settings: OrchestratorSettings, prices: Mapping[str, GpuPrice]
) -> dict[str, list[dict[str, Any]]]:
    """Per tier, every GPU type with why it ranks where it does (first = tried first)."""
    return {t.name: [c.as_dict() for c in rank(settings, t, prices)] for t in settings.tiers}


def why_chosen(
    settings: OrchestratorSettings, tier: str, gpu: str, prices: Mapping[str, GpuPrice]
) -> str | None:
    """Why sizing ranks ``gpu`` where it does in ``tier`` (None: not one of its types)."""
    cfg = settings.tier(tier)
    choices = rank(settings, cfg, prices) if cfg is not None else []
    return next((c.reason for c in choices if c.gpu_type == gpu), None)


def expected_fps(
    settings: OrchestratorSettings, tier: TierConfig, prices: Mapping[str, GpuPrice]
) -> float | None:
    """The catalog's capacity (reference-model fps) of the GPU type the tier tries first,
    for the scaler before any worker of the tier measured its own (None: unknown)."""
    if not tier.models:
        return None
    first = next((c for c in rank(settings, tier, prices) if c.fits), None)
    return first.capacity_fps if first is not None else None
