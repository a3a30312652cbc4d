"""How many workers each tier should have now: schedule and demand.

The scaler packs the streams onto a *planned* fleet the way placement packs
them onto the real one, stream by stream (a stream cannot be split across
workers, so fluid ``total fps / capacity`` arithmetic under-provisions when
streams do not divide a worker evenly):

1. Each runnable tier starts with the workers its schedule keeps warm anyway
   (``warm_target``): they are paid for, so they are filled first.
2. Streams go in priority order (critical first), largest demand first, to
   the cheapest planned worker with room that policy allows (critical never
   on spot; batch only on batch-only tiers when there are any), best fit.
3. A stream that fits nowhere opens a pod in the cheapest allowed tier
   below ``max_workers`` (per unit of capacity; spot first on a tie, then the
   order tiers are listed in). A pod brings one worker per GPU (``gpu_count``):
   each is a bin of its own (a stream runs on one GPU).

Model memory (issue 17): once a tier's workers have said their model memory budget
(``/info``), a planned worker of that tier also has that budget, less its pinned
(default) models; a stream fits it only if its model is already planned there or the
model's memory (:class:`deploy.placement.ModelNeeds`) fits beside those planned, so a
stream whose model fits no worker with room opens a pod instead of staying unplaced.
Tiers whose workers have not said (or have no budget) are planned on frame rate alone.

Latency budgets (issue 18): a tier whose workers were measured (:mod:`deploy.latency`:
their round trip from the ingest plus their processing, the last figures known) and
miss a stream's ``latency_slo_ms`` comes after the tiers that meet it or are not
measured, for that stream: it is planned on a worker of a tier that fits its budget,
and when none has room a pod of such a tier is opened (below its ``max_workers``)
rather than the stream planned over its budget; placement then moves it there.

A serverless tier (``serverless_endpoint_id``) rents no pods: it is never planned (its
target is 0) and does not pin batch streams (:mod:`deploy.serverless_jobs`).

A stream larger than one worker, or with every allowed tier full, opens
nothing; placement reports it as unplaced. ``limits`` caps tiers below their
``max_workers`` (a tier that just answered "no capacity" is held at the pods
it has, so its demand goes to the next allowed tier).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from deploy.models import PodRecord, StreamSpec
from deploy.placement import EPS, ModelNeeds, allowed, by_priority, demand
from deploy.providers.base import GpuPrice
from deploy.schedule import may_run, warm_target
from deploy.settings import OrchestratorSettings, TierConfig
from deploy.sizing import expected_fps


def per_worker(
    settings: OrchestratorSettings,
    tier: TierConfig,
    pods: Iterable[PodRecord],
    expected: float | None = None,
) -> float:
    """Capacity of one worker (one GPU): the tier's fixed capacity, else measured (mean of
    ready workers), else ``expected`` (the GPU catalog's, :func:`deploy.sizing.expected_fps`),
    else the default."""
    if tier.capacity_fps:
        return tier.capacity_fps
    measured = [
        w.capacity_fps
        for p in pods
        if p.tier == tier.name
        for w in p.workers()
        if w.ready and w.capacity_fps > 0
    ]
    if measured:
        return sum(measured) / len(measured)
    return expected or settings.default_capacity_fps


def unit_price(tier: TierConfig, prices: Mapping[str, GpuPrice], capacity: float) -> float:
    price = prices.get(tier.gpu_types[0])
    usd = price.price(tier.cloud_types[0], tier.interruptible) if price else 0.0
    return usd / capacity if capacity > 0 else math.inf


@dataclass(frozen=True, slots=True)
class TierMemory:
    """Model memory of one worker of a tier, as its workers said: free MiB beside the
    pinned models (None: unknown, memory not planned) and the pinned models' names."""

    free_mb: float | None = None
    pinned: frozenset[str] = frozenset()

    def need_mb(self, model: str, needs: ModelNeeds) -> float:
        return 0.0 if model in self.pinned else needs.mb(model)


def tier_memory(tier: TierConfig, pods: Iterable[PodRecord]) -> TierMemory:
    """The tightest model memory among the tier's ready workers that have a budget."""
    said = [
        w.models
        for p in pods
        if p.tier == tier.name
        for w in p.workers()
        if w.ready and w.models is not None and w.models.budget_mb > 0
    ]
    if not said:
        return TierMemory()
    free = min(m.budget_mb - sum(m.loaded.get(n, 0.0) for n in m.pinned) for m in said)
    pinned = frozenset.intersection(*(frozenset(m.pinned) for m in said))
    return TierMemory(max(0.0, free), pinned)


@dataclass(slots=True)
class _Planned:
    """One worker of the planned fleet."""

    tier: TierConfig
    rank: tuple[float, bool, int]
    room: float
    used: float = 0.0
    memory: TierMemory = TierMemory()
    models: dict[str, float] = field(default_factory=dict)
    """Models planned here (not pinned) -> their MiB."""

    def fits(self, model: str, need: float, needs: ModelNeeds) -> bool:
        if self.used + need > self.room + EPS:
            return False
        free = self.memory.free_mb
        if free is None or model in self.models:
            return True
        return sum(self.models.values()) + self.memory.need_mb(model, needs) <= free + EPS

    def take(self, model: str, need: float, needs: ModelNeeds) -> None:
        self.used += need
        mb = self.memory.need_mb(model, needs)
        if self.memory.free_mb is not None and mb > 0:
            self.models[model] = mb


def plan_workers(
    settings: OrchestratorSettings,
    streams: Iterable[StreamSpec],
    capacity: Mapping[str, float],
    prices: Mapping[str, GpuPrice],
    warm: Mapping[str, int],
    limits: Mapping[str, int] | None = None,
    memory: Mapping[str, TierMemory] | None = None,
    needs: ModelNeeds | None = None,
    expected: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """Pods per tier (tiers in ``warm``: the runnable ones) to carry ``streams``; a pod
    of the tier's ``gpu_count`` brings that many workers (bins), each ``capacity`` and
    the tier's model ``memory`` (``needs``: each model's MiB); ``expected``: each
    measured tier's expected latency (ms), for streams with a latency budget."""
    limits, memory, needs = limits or {}, memory or {}, needs or ModelNeeds()
    index = {t.name: i for i, t in enumerate(settings.tiers)}
    tiers = [t for t in settings.tiers if t.name in warm]
    rank = {t.name: (unit_price(t, prices, capacity[t.name]), not t.interruptible, index[t.name])
            for t in tiers}  # fmt: skip
    room = {t.name: capacity[t.name] * settings.target_utilization for t in tiers}
    most = {t.name: min(t.max_workers, limits.get(t.name, t.max_workers)) for t in tiers}
    count = {t.name: min(warm[t.name], most[t.name]) for t in tiers}
    mem = {t.name: memory.get(t.name, TierMemory()) for t in tiers}
    planned = [
        _Planned(t, rank[t.name], room[t.name], memory=mem[t.name])
        for t in tiers
        for _ in range(count[t.name] * t.gpu_count)
    ]
    pinned = any(t.batch_only and t.rents_pods for t in settings.tiers)
    by_rank = sorted(tiers, key=lambda t: rank[t.name])
    for stream in by_priority(streams, settings.model_costs):
        need = demand(stream, settings.model_costs)
        late = functools.partial(_late, stream, expected or {})
        may = (t for t in by_rank if allowed(stream, not t.takes_critical, t.batch_only, pinned))
        ok = sorted(may, key=lambda t: late(t.name))
        names = {t.name for t in ok}
        model = stream.model
        fits = [p for p in planned if p.tier.name in names and p.fits(model, need, needs)]
        best = min(fits, key=lambda p: (late(p.tier.name), p.rank, p.room - p.used - need),
                   default=None)  # fmt: skip
        tier = next((t for t in ok if count[t.name] < most[t.name]
                     and _Planned(t, rank[t.name], room[t.name], memory=mem[t.name])
                     .fits(model, need, needs)), None)  # fmt: skip
        if best is not None and (not late(best.tier.name) or tier is None or late(tier.name)):
            best.take(model, need, needs)
            continue
        if tier is not None:  # a new pod: its first worker takes the stream
            new = [_Planned(tier, rank[tier.name], room[tier.name], memory=mem[tier.name])
                   for _ in range(tier.gpu_count)]  # fmt: skip
            new[0].take(model, need, needs)
            planned += new
            count[tier.name] += 1
    return count


def _late(stream: StreamSpec, expected: Mapping[str, float], tier: str) -> bool:
    """The tier was measured over the stream's latency budget."""
    ms = expected.get(tier)
    return stream.latency_slo_ms is not None and ms is not None and ms > stream.latency_slo_ms


def tier_targets(
    settings: OrchestratorSettings,
    streams: Iterable[StreamSpec],
    pods: Mapping[str, PodRecord],
    prices: Mapping[str, GpuPrice],
    now: float,
    limits: Mapping[str, int] | None = None,
    needs: ModelNeeds | None = None,
    expected: Mapping[str, float] | None = None,
) -> dict[str, int]:
    tz = ZoneInfo(settings.timezone)
    capacity = {
        t.name: per_worker(settings, t, pods.values(), expected_fps(settings, t, prices))
        for t in settings.tiers
    }
    warm = {
        t.name: min(t.max_workers, warm_target(t, now, tz))
        for t in settings.tiers
        if may_run(t, now, tz) and t.max_workers > 0 and t.rents_pods  # serverless: none
    }
    memory = {t.name: tier_memory(t, pods.values()) for t in settings.tiers}
    planned = plan_workers(
        settings, streams, capacity, prices, warm, limits, memory, needs, expected
    )
    return {t.name: planned.get(t.name, 0) for t in settings.tiers}
