"""The last hour of the fleet's cost and size, kept by the orchestrator (``GET /v1/history``).

Every ``interval_s`` (10 s) :class:`FleetHistory` writes one point per series
from the pod records and the placements (Redis, so any replica can keep it):

* ``usd_per_hour``: what the fleet costs now (the pods the provider bills:
  those with a provider id), the burn rate of ``/v1/fleet``;
* ``ondemand_usd_per_hour``: what the same pods would cost on on-demand;
* ``usd_per_stream_hour``: ``usd_per_hour`` / ``streams_placed`` (null with
  no stream placed);
* ``streams_placed``: streams assigned to a worker (one per GPU) of a pod that exists;
* ``pods``: billed pods per tier (the tiers of the settings: a fixed set).

Memory is fixed at creation: preallocated arrays of ``points`` doubles (360:
one hour) written round-robin, so 10,000 samples leave exactly 360 points.
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from deploy.models import PodRecord

POINTS = 360
INTERVAL_S = 10.0
SERIES = ("usd_per_hour", "ondemand_usd_per_hour", "usd_per_stream_hour", "streams_placed")


class FleetHistoryView(BaseModel):
    """The last hour: timestamps and, aligned with them, the series (oldest first)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(description="Seconds between two points.")
    points: int = Field(description="The most points kept (one hour).")
    timestamps: list[float] = Field(description="Unix time of each point, oldest first.")
    usd_per_hour: list[float] = Field(description="The fleet's cost now ($/h).")
    ondemand_usd_per_hour: list[float] = Field(description="The same pods on on-demand ($/h).")
    usd_per_stream_hour: list[float | None] = Field(
        description="$/h per placed stream (null: none placed)."
    )
    streams_placed: list[float] = Field(description="Streams running on a pod.")
    pods: dict[str, list[float]] = Field(description="Billed pods per tier.")


def _ring(points: int) -> array.array[float]:
    return array.array("d", [math.nan]) * points


class FleetHistory:
    """Fixed-memory rings of the fleet's cost and size (see the module)."""

    def __init__(self, tiers: Sequence[str], points: int = POINTS, interval_s: float = INTERVAL_S):
        if points < 1 or not interval_s > 0:
            raise ValueError("history needs points >= 1 and interval_s > 0")
        self.points, self.interval_s = points, interval_s
        self._times = _ring(points)
        self._series = {name: _ring(points) for name in SERIES}
        self._pods = {tier: _ring(points) for tier in tiers}
        self._next = 0
        self._count = 0
        self.last_at: float | None = None

    def __len__(self) -> int:
        """Points held (at most ``points``)."""
        return self._count

    def due(self, now: float) -> bool:
        """Whether a point is due at ``now`` (none yet, or ``interval_s`` since the last)."""
        return self.last_at is None or now - self.last_at >= self.interval_s

    def sample(self, at: float, pods: Mapping[str, PodRecord], assigned: Mapping[str, str]) -> None:
        """Write one point at Unix time ``at`` from the pod records and the placements."""
        billed = [p for p in pods.values() if p.provider_id is not None]
        burn = sum(p.cost_per_hr for p in billed)
        workers = {w.name for rec in pods.values() for w in rec.workers()}  # one per GPU
        placed = sum(1 for worker in assigned.values() if worker in workers)
        row = {
            "usd_per_hour": burn,
            "ondemand_usd_per_hour": sum(max(p.ondemand_per_hr, p.cost_per_hr) for p in billed),
            "usd_per_stream_hour": burn / placed if placed else math.nan,
            "streams_placed": float(placed),
        }
        slot = self._next
        for name, value in row.items():
            self._series[name][slot] = value
        for tier, ring in self._pods.items():
            ring[slot] = float(sum(1 for p in billed if p.tier == tier))
        self._times[slot] = at
        self._next = (slot + 1) % self.points
        self._count = min(self._count + 1, self.points)
        self.last_at = at

    def read(self) -> FleetHistoryView:
        """The points held, oldest first."""
        start = (self._next - self._count) % self.points
        order = [(start + i) % self.points for i in range(self._count)]

        def values(ring: array.array[float]) -> list[float | None]:
            return [None if math.isnan(ring[i]) else round(ring[i], 6) for i in order]

        return FleetHistoryView.model_validate({
            "interval_s": self.interval_s, "points": self.points,
            "timestamps": [self._times[i] for i in order],
            **{name: values(ring) for name, ring in self._series.items()},
            "pods": {tier: values(ring) for tier, ring in self._pods.items()},
        })  # fmt: skip
