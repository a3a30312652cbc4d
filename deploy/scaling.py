"""How many workers each tier should have now: schedule and demand.

``target = min(max_workers, max(warm_target(schedule), workers for the demand
routed to the tier))``. Demand is routed like placement routes streams:
critical to on-demand tiers only, batch to batch-only tiers when there are
any (and only while one may run), everything else to the cheapest tier per
unit of capacity (spot when cheaper), overflowing to the next tier when a
tier is at ``max_workers``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from zoneinfo import ZoneInfo

from deploy.models import PRIORITY_ORDER, PodRecord, StreamSpec
from deploy.placement import demand as stream_demand
from deploy.placement import workers_needed
from deploy.providers.base import GpuPrice
from deploy.schedule import may_run, warm_target
from deploy.settings import OrchestratorSettings, TierConfig


def per_worker(
    settings: OrchestratorSettings, tier: TierConfig, pods: Iterable[PodRecord]
) -> float:
    """The tier's fixed capacity, else measured (mean of ready workers), else the default."""
    if tier.capacity_fps:
        return tier.capacity_fps
    measured = [
        p.capacity_fps for p in pods if p.tier == tier.name and p.ready and p.capacity_fps > 0
    ]
    if measured:
        return sum(measured) / len(measured)
    return settings.default_capacity_fps


def unit_price(tier: TierConfig, prices: Mapping[str, GpuPrice], capacity: float) -> float:
    price = prices.get(tier.gpu_types[0])
    usd = price.price(tier.cloud_types[0], tier.spot) if price else 0.0
    return usd / capacity if capacity > 0 else math.inf


def _allowed(stream: StreamSpec, tier: TierConfig, batch_pinned: bool) -> bool:
    if stream.priority == "critical" and tier.spot:
        return False
    if tier.batch_only:
        return stream.priority == "batch"
    return not (batch_pinned and stream.priority == "batch")


def route_demand(
    settings: OrchestratorSettings,
    streams: Iterable[StreamSpec],
    capacity: Mapping[str, float],
    prices: Mapping[str, GpuPrice],
    runnable: set[str],
) -> dict[str, float]:
    """Demand (fps units) each tier should carry."""
    tiers = [t for t in settings.tiers if t.name in runnable]
    order = sorted(
        tiers, key=lambda t: (unit_price(t, prices, capacity[t.name]), not t.spot, t.name)
    )
    batch_pinned = any(t.batch_only for t in settings.tiers)
    room = {t.name: t.max_workers * capacity[t.name] * settings.target_utilization for t in tiers}
    load = dict.fromkeys(room, 0.0)
    for s in sorted(streams, key=lambda s: (PRIORITY_ORDER[s.priority], s.id)):
        need = stream_demand(s, settings.model_costs)
        options = [t for t in order if _allowed(s, t, batch_pinned)]
        chosen = next((t for t in options if load[t.name] + need <= room[t.name]), None)
        if chosen is None and options:
            chosen = options[-1]
        if chosen is not None:
            load[chosen.name] += need
    return load


def tier_targets(
    settings: OrchestratorSettings,
    streams: Iterable[StreamSpec],
    pods: Mapping[str, PodRecord],
    prices: Mapping[str, GpuPrice],
    now: float,
) -> dict[str, int]:
    tz = ZoneInfo(settings.timezone)
    capacity = {t.name: per_worker(settings, t, pods.values()) for t in settings.tiers}
    runnable = {t.name for t in settings.tiers if may_run(t, now, tz) and t.max_workers > 0}
    load = route_demand(settings, streams, capacity, prices, runnable)
    out: dict[str, int] = {}
    for t in settings.tiers:
        if t.name not in runnable:
            out[t.name] = 0
            continue
        need = workers_needed(load.get(t.name, 0.0), capacity[t.name], settings.target_utilization)
        out[t.name] = min(t.max_workers, max(warm_target(t, now, tz), need))
    return out
