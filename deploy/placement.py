"""Stream placement: bin-pack streams onto ready workers, by policy.

* ``critical`` streams only go to on-demand workers, never to spot.
* ``standard`` and ``batch`` streams go where capacity is cheapest per unit
  (spot, when it is cheaper), falling back to on-demand when spot is full or
  gone.
* A stream stays where it is while its worker is ready, allowed and not over
  capacity (no churn); a non-critical stream on on-demand moves to spot once
  spot has room (it is cheaper).
* Among allowed workers of equal price, best fit: the fullest one the stream
  still fits (fewer, fuller workers).
* Model-aware (issue 17), for workers whose models are known (``Slot.vram_budget_mb``
  set, from the worker's ``/info``, which the fleet's probes keep in its state): a
  worker takes a stream only if it has the stream's model loaded, or room for it in
  its budget once the models without streams are evicted (the worker evicts those,
  least recently used first); among workers of equal price one that has the model
  loaded wins (no load time), then the one whose load is shortest. A stream whose
  model is loaded nowhere thus goes to a worker with room, which loads it, instead of
  being left unplaced. A worker without a budget has room for any model; workers
  whose models are unknown take any model, as before.
* Latency-aware (issue 18), for workers whose round trip to the ingest was measured
  (:mod:`deploy.latency`): a stream with ``latency_slo_ms`` goes first where its expected
  latency (the worker's round trip plus its processing time) fits the budget, then where
  it is not known yet; when it fits nowhere it goes to the fastest worker with room and
  the breach is reported (:attr:`Placement.breaches`). Then every stream prefers the
  region with the lowest round trip (regions within ``region_slack_ms`` of it count as
  equally close), and price decides among those as above. With nothing measured,
  placement is as it was. A stream moves when another worker would win on these terms.

Pure functions; the orchestrator applies the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from deploy.models import PRIORITY_ORDER, StreamSpec, WorkerModels

EPS = 1e-9


@dataclass(slots=True)
class Slot:
    """A worker as placement sees it."""

    name: str
    tier: str
    no_critical: bool
    """Its tier does not take critical streams (:attr:`TierConfig.takes_critical`)."""
    capacity: float
    cost_per_hr: float
    used: float = 0.0
    batch_only: bool = False
    vram_budget_mb: float | None = None
    """The worker's model memory budget; None: its models are unknown (any model fits,
    none is preferred); infinite: it has no budget (any model fits, loaded ones win)."""
    loaded: Mapping[str, float] = field(default_factory=dict)
    """Models loaded on the worker -> their memory (MiB)."""
    pinned: frozenset[str] = frozenset()
    """Models the worker never evicts (its default model)."""
    hosting: set[str] = field(default_factory=set)
    """Models of the streams placed here so far (they cannot be evicted)."""
    region: str | None = None
    rtt_ms: float | None = None
    """Round trip from the ingest (its own measurement, else its region's), ms; None:
    unknown."""
    region_rtt_ms: float | None = None
    """Its region's round trip (the median of the region's measured workers), ms."""
    processing_ms: float = 0.0
    """Its processing time of a frame, ms (0: unknown)."""

    @property
    def expected_ms(self) -> float | None:
        """A frame's expected latency here: round trip plus processing (None: unknown)."""
        return None if self.rtt_ms is None else self.rtt_ms + self.processing_ms

    @property
    def unit_cost(self) -> float:
        return self.cost_per_hr / self.capacity if self.capacity > 0 else math.inf

    def fits(self, demand: float) -> bool:
        return self.used + demand <= self.capacity + EPS

    def can_host(self, model: str, need_mb: float) -> bool:
        """Whether the model is here or fits beside the models that must stay."""
        if self.vram_budget_mb is None or model in self.hosting or model in self.pinned:
            return True
        kept = self.hosting | self.pinned
        held = sum(self.loaded.get(m, 0.0) for m in kept)
        return held + need_mb <= self.vram_budget_mb + EPS

    def load_s(self, model: str, load_s: Mapping[str, float]) -> float:
        """Expected seconds before the model serves here (0 when loaded)."""
        if self.vram_budget_mb is None or model in self.loaded:
            return 0.0
        return load_s.get(model, 1.0)

    def take(self, stream: StreamSpec, need: float, need_mb: float) -> None:
        """Place ``stream`` here: its demand, and its model now loaded and kept."""
        self.used += need
        if self.vram_budget_mb is not None and stream.model not in self.loaded:
            self.loaded = {**self.loaded, stream.model: need_mb}
        self.hosting.add(stream.model)


@dataclass(frozen=True, slots=True)
class ModelNeeds:
    """What placement knows of each model: memory (MiB) and load time (s)."""

    vram_mb: Mapping[str, float] = field(default_factory=dict)
    load_s: Mapping[str, float] = field(default_factory=dict)

    def mb(self, model: str) -> float:
        return self.vram_mb.get(model, 0.0)


class SlotModels(TypedDict, total=False):
    """A worker's models as :class:`Slot` keywords (empty: unknown, any model fits)."""

    vram_budget_mb: float
    loaded: Mapping[str, float]
    pinned: frozenset[str]


def slot_models(models: WorkerModels | None) -> SlotModels:
    """:class:`Slot` keywords for a worker's models (:attr:`WorkerState.models`); a worker
    without a budget has room for any model (but one that has it loaded still wins)."""
    if models is None:
        return {}
    budget = models.budget_mb or math.inf
    return {"vram_budget_mb": budget, "loaded": dict(models.loaded),
            "pinned": frozenset(models.pinned)}  # fmt: skip


def worker_models(info: Mapping[str, object]) -> SlotModels:
    """A worker's ``/info`` as :class:`Slot` keywords (``vram_budget_mb``, ``loaded``,
    ``pinned``); empty (models unknown) for a worker from before models. Read tolerantly
    (:meth:`WorkerModels.from_info`)."""
    return slot_models(WorkerModels.from_info(info))


def model_needs(vram_mb: Mapping[str, float], workers: Iterable[WorkerModels | None]) -> ModelNeeds:
    """What placement knows of each model: its memory (``vram_mb``, the registry's; for a
    model the registry lacks, what a worker that loaded it says) and its load time (the
    longest any worker reported)."""
    mb, load_s = dict(vram_mb), dict[str, float]()
    for models in (m for m in workers if m is not None):
        for name, s in models.load_s.items():
            load_s[name] = max(s, load_s.get(name, 0.0))
        for name, held in models.loaded.items():
            if name not in vram_mb:
                mb[name] = max(held, mb.get(name, 0.0))
    return ModelNeeds(mb, load_s)


@dataclass(frozen=True, slots=True)
class SloBreach:
    """A stream placed where its latency budget does not hold (nowhere else had room)."""

    worker: str
    expected_ms: float
    slo_ms: float
    rtt_ms: float
    processing_ms: float

    def as_dict(self) -> dict[str, object]:
        return {"worker": self.worker, "expected_ms": round(self.expected_ms, 1),
                "slo_ms": self.slo_ms, "rtt_ms": round(self.rtt_ms, 1),
                "processing_ms": round(self.processing_ms, 1)}  # fmt: skip


@dataclass(slots=True)
class Placement:
    assign: dict[str, str] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)
    breaches: dict[str, SloBreach] = field(default_factory=dict)
    """Streams placed over their latency budget (``latency_slo_ms``), with the figures."""

    def moves(self, before: Mapping[str, str]) -> dict[str, tuple[str | None, str | None]]:
        """stream -> (old worker, new worker) for every change."""
        ids = set(before) | set(self.assign)
        out = {s: (before.get(s), self.assign.get(s)) for s in ids}
        return {s: v for s, v in out.items() if v[0] != v[1]}


def allowed(
    stream: StreamSpec, no_critical: bool, batch_only: bool, batch_pinned: bool = False
) -> bool:
    """Policy: critical streams only where a tier takes them (neither interruptible nor
    community-cloud capacity); batch-only workers take batch streams only; with
    ``batch_pinned`` (a batch-only tier exists) batch streams run only there."""
    if stream.priority == "critical" and no_critical:
        return False
    if batch_only:
        return stream.priority == "batch"
    return not (batch_pinned and stream.priority == "batch")


def _allowed(stream: StreamSpec, slot: Slot, batch_pinned: bool) -> bool:
    return allowed(stream, slot.no_critical, slot.batch_only, batch_pinned)


def demand(stream: StreamSpec, model_costs: Mapping[str, float]) -> float:
    return stream.fps * model_costs.get(stream.model, 1.0)


def by_priority(streams: Iterable[StreamSpec], costs: Mapping[str, float]) -> list[StreamSpec]:
    """Critical first, then standard, then batch; larger demand first (first-fit decreasing)."""
    return sorted(streams, key=lambda s: (PRIORITY_ORDER[s.priority], -demand(s, costs), s.id))


def _ok(stream: StreamSpec, slot: Slot, need: float, pin: bool, models: ModelNeeds) -> bool:
    return (
        _allowed(stream, slot, pin)
        and slot.fits(need)
        and slot.can_host(stream.model, models.mb(stream.model))
    )


def _slo_class(stream: StreamSpec, slot: Slot) -> int:
    """0: fits the stream's latency budget (or it has none); 1: not known yet (no round
    trip measured); 2: over it."""
    expected = slot.expected_ms
    if stream.latency_slo_ms is None:
        return 0
    if expected is None:
        return 1
    return 0 if expected <= stream.latency_slo_ms + EPS else 2


def _distance(stream: StreamSpec, slot: Slot) -> float:
    """How far the slot is, ms: over the budget, its expected latency (the fastest is the
    best available); else its region's round trip (unknown: infinitely far)."""
    expected = slot.expected_ms
    if expected is not None and _slo_class(stream, slot) == 2:
        return expected
    return math.inf if slot.region_rtt_ms is None else slot.region_rtt_ms


def _better(stream: StreamSpec, a: Slot, b: Slot, slack_ms: float) -> bool:
    """Whether ``a`` wins over ``b``: its latency class, then its distance (beyond
    ``slack_ms``), then its price."""
    ca, cb = _slo_class(stream, a), _slo_class(stream, b)
    if ca != cb:
        return ca < cb
    da, db = _distance(stream, a), _distance(stream, b)
    if da != db and abs(da - db) > slack_ms:
        return da < db
    return a.unit_cost < b.unit_cost - EPS


def _best(
    stream: StreamSpec, need: float, slots: list[Slot], pin: bool, models: ModelNeeds,
    slack_ms: float = 0.0,
) -> Slot | None:  # fmt: skip
    fitting = [s for s in slots if _ok(stream, s, need, pin, models)]
    if not fitting:
        return None
    cls = min(_slo_class(stream, s) for s in fitting)
    fitting = [s for s in fitting if _slo_class(stream, s) == cls]
    near = min(_distance(stream, s) for s in fitting)
    fitting = [s for s in fitting if _distance(stream, s) <= near + slack_ms]
    return min(fitting, key=lambda s: (s.unit_cost, s.load_s(stream.model, models.load_s),
                                       s.capacity - s.used - need, s.name))  # fmt: skip


def _keep(
    stream: StreamSpec, slot: Slot | None, need: float, slots: list[Slot], pin: bool,
    models: ModelNeeds, slack_ms: float = 0.0,
) -> bool:  # fmt: skip
    if slot is None or not _ok(stream, slot, need, pin, models):
        return False
    return not any(
        s is not slot and _better(stream, s, slot, slack_ms) and _ok(stream, s, need, pin, models)
        for s in slots
    )


def breach(stream: StreamSpec, slot: Slot) -> SloBreach | None:
    """The breach of ``stream``'s latency budget on ``slot``, if it is measured over it."""
    expected = slot.expected_ms
    if stream.latency_slo_ms is None or expected is None or _slo_class(stream, slot) != 2:
        return None
    rtt = slot.rtt_ms or 0.0
    return SloBreach(slot.name, expected, stream.latency_slo_ms, rtt, slot.processing_ms)


def place(
    streams: Iterable[StreamSpec],
    slots: list[Slot],
    current: Mapping[str, str],
    model_costs: Mapping[str, float],
    *,
    batch_pinned: bool = False,
    pins: Mapping[str, str] | None = None,
    models: ModelNeeds | None = None,
    region_slack_ms: float = 0.0,
) -> Placement:
    """Assign every stream to a slot (or leave it unplaced when nothing fits).

    ``pins`` (operator moves) win over price while their worker is allowed and fits.
    ``models``: each model's memory and load time, for slots whose models are known.
    ``region_slack_ms``: round trips this close count as equally near (price decides).
    """
    by_name = {s.name: s for s in slots}
    pins = pins or {}
    needs = models or ModelNeeds()
    ordered = by_priority(streams, model_costs)
    result = Placement()
    pending: list[StreamSpec] = []
    for stream in ordered:  # pass 1: keep what may stay
        need = demand(stream, model_costs)
        pinned = by_name.get(pins.get(stream.id, ""))
        if pinned is not None and _ok(stream, pinned, need, batch_pinned, needs):
            pinned.take(stream, need, needs.mb(stream.model))
            result.assign[stream.id] = pinned.name
            continue
        slot = by_name.get(current.get(stream.id, ""))
        if _keep(stream, slot, need, slots, batch_pinned, needs, region_slack_ms):
            assert slot is not None  # noqa: S101 - _keep checked it
            slot.take(stream, need, needs.mb(stream.model))
            result.assign[stream.id] = slot.name
        else:
            pending.append(stream)
    for stream in pending:  # pass 2: first-fit decreasing, cheapest then best fit
        need = demand(stream, model_costs)
        best = _best(stream, need, slots, batch_pinned, needs, region_slack_ms)
        if best is None:
            result.unplaced.append(stream.id)
            continue
        best.take(stream, need, needs.mb(stream.model))
        result.assign[stream.id] = best.name
    for stream in ordered:
        where = by_name.get(result.assign.get(stream.id, ""))
        late = breach(stream, where) if where is not None else None
        if late is not None:
            result.breaches[stream.id] = late
    return result
