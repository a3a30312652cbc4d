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

Pure functions; the orchestrator applies the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from deploy.models import PRIORITY_ORDER, StreamSpec

EPS = 1e-9


@dataclass(slots=True)
class Slot:
    """A worker as placement sees it."""

    name: str
    tier: str
    spot: bool
    capacity: float
    cost_per_hr: float
    used: float = 0.0
    batch_only: bool = False

    @property
    def unit_cost(self) -> float:
        return self.cost_per_hr / self.capacity if self.capacity > 0 else math.inf

    def fits(self, demand: float) -> bool:
        return self.used + demand <= self.capacity + EPS


@dataclass(slots=True)
class Placement:
    assign: dict[str, str] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)

    def moves(self, before: Mapping[str, str]) -> dict[str, tuple[str | None, str | None]]:
        """stream -> (old worker, new worker) for every change."""
        ids = set(before) | set(self.assign)
        out = {s: (before.get(s), self.assign.get(s)) for s in ids}
        return {s: v for s, v in out.items() if v[0] != v[1]}


def allowed(stream: StreamSpec, spot: bool, batch_only: bool, batch_pinned: bool = False) -> bool:
    """Policy: critical never on spot; batch-only workers take batch streams only; with
    ``batch_pinned`` (a batch-only tier exists) batch streams run only there."""
    if stream.priority == "critical" and spot:
        return False
    if batch_only:
        return stream.priority == "batch"
    return not (batch_pinned and stream.priority == "batch")


def _allowed(stream: StreamSpec, slot: Slot, batch_pinned: bool) -> bool:
    return allowed(stream, slot.spot, slot.batch_only, batch_pinned)


def demand(stream: StreamSpec, model_costs: Mapping[str, float]) -> float:
    return stream.fps * model_costs.get(stream.model, 1.0)


def by_priority(streams: Iterable[StreamSpec], costs: Mapping[str, float]) -> list[StreamSpec]:
    """Critical first, then standard, then batch; larger demand first (first-fit decreasing)."""
    return sorted(streams, key=lambda s: (PRIORITY_ORDER[s.priority], -demand(s, costs), s.id))


def _best(stream: StreamSpec, need: float, slots: list[Slot], pin: bool) -> Slot | None:
    fitting = [s for s in slots if _allowed(stream, s, pin) and s.fits(need)]
    if not fitting:
        return None
    return min(fitting, key=lambda s: (s.unit_cost, s.capacity - s.used - need, s.name))


def _keep(stream: StreamSpec, slot: Slot | None, need: float, slots: list[Slot], pin: bool) -> bool:
    if slot is None or not _allowed(stream, slot, pin) or not slot.fits(need):
        return False
    limit = slot.unit_cost - EPS
    return not any(s.unit_cost < limit and s.fits(need) and _allowed(stream, s, pin) for s in slots)


def place(
    streams: Iterable[StreamSpec],
    slots: list[Slot],
    current: Mapping[str, str],
    model_costs: Mapping[str, float],
    *,
    batch_pinned: bool = False,
    pins: Mapping[str, str] | None = None,
) -> Placement:
    """Assign every stream to a slot (or leave it unplaced when nothing fits).

    ``pins`` (operator moves) win over price while their worker is allowed and fits.
    """
    by_name = {s.name: s for s in slots}
    pins = pins or {}
    ordered = by_priority(streams, model_costs)
    result = Placement()
    pending: list[StreamSpec] = []
    for stream in ordered:  # pass 1: keep what may stay
        need = demand(stream, model_costs)
        pinned = by_name.get(pins.get(stream.id, ""))
        if pinned is not None and _allowed(stream, pinned, batch_pinned) and pinned.fits(need):
            pinned.used += need
            result.assign[stream.id] = pinned.name
            continue
        slot = by_name.get(current.get(stream.id, ""))
        if _keep(stream, slot, need, slots, batch_pinned):
            assert slot is not None  # noqa: S101 - _keep checked it
            slot.used += need
            result.assign[stream.id] = slot.name
        else:
            pending.append(stream)
    for stream in pending:  # pass 2: first-fit decreasing, cheapest then best fit
        need = demand(stream, model_costs)
        best = _best(stream, need, slots, batch_pinned)
        if best is None:
            result.unplaced.append(stream.id)
            continue
        best.used += need
        result.assign[stream.id] = best.name
    return result
