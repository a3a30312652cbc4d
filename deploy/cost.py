"""Cost accounting: $/hour per pod from the provider, integrated over time.

Per tick the orchestrator adds, for every pod it pays for, ``cost_per_hr x dt``
to the fleet cost and ``ondemand_per_hr x dt`` to what the same capacity would
cost on on-demand (the saving), and ``served streams x dt`` to stream-seconds. A job on
a serverless endpoint adds the execution seconds charged to it as they come
(:func:`serverless_spend`): the fleet cost includes them, with no saving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class CostTotals:
    fleet_usd: float = 0.0
    ondemand_equiv_usd: float = 0.0
    stream_seconds: float = 0.0
    pod_seconds: float = 0.0
    spot_pod_seconds: float = 0.0
    serverless_usd: float = 0.0
    """Of ``fleet_usd``: execution time charged to jobs on serverless endpoints."""
    by_tier_usd: dict[str, float] = field(default_factory=dict)

    @property
    def stream_hours(self) -> float:
        return self.stream_seconds / 3600

    @property
    def per_stream_hour_usd(self) -> float:
        return self.fleet_usd / self.stream_hours if self.stream_seconds > 0 else 0.0

    @property
    def saving(self) -> float:
        """Share saved vs the same capacity on on-demand (0..1)."""
        if self.ondemand_equiv_usd <= 0:
            return 0.0
        return 1.0 - self.fleet_usd / self.ondemand_equiv_usd

    def as_dict(self) -> dict[str, object]:
        return {
            "fleet_usd": round(self.fleet_usd, 6),
            "ondemand_equiv_usd": round(self.ondemand_equiv_usd, 6),
            "saving_vs_ondemand": round(self.saving, 4),
            "stream_hours": round(self.stream_hours, 4),
            "cost_per_stream_hour_usd": round(self.per_stream_hour_usd, 6),
            "pod_hours": round(self.pod_seconds / 3600, 4),
            "spot_pod_hours": round(self.spot_pod_seconds / 3600, 4),
            "serverless_usd": round(self.serverless_usd, 6),
            "by_tier_usd": {k: round(v, 6) for k, v in sorted(self.by_tier_usd.items())},
        }

    @classmethod
    def from_flat(cls, flat: Mapping[str, float]) -> CostTotals:
        totals = cls(
            fleet_usd=flat.get("fleet_usd", 0.0),
            ondemand_equiv_usd=flat.get("ondemand_equiv_usd", 0.0),
            stream_seconds=flat.get("stream_seconds", 0.0),
            pod_seconds=flat.get("pod_seconds", 0.0),
            spot_pod_seconds=flat.get("spot_pod_seconds", 0.0),
            serverless_usd=flat.get("serverless_usd", 0.0),
        )
        totals.by_tier_usd = {
            k.removeprefix("tier:"): v for k, v in flat.items() if k.startswith("tier:")
        }
        return totals


@dataclass(frozen=True, slots=True)
class PaidPod:
    tier: str
    spot: bool
    cost_per_hr: float
    ondemand_per_hr: float


def accrue(pods: Iterable[PaidPod], served_streams: int, dt_s: float) -> dict[str, float]:
    """Increments (flat, for Redis HINCRBYFLOAT) for ``dt_s`` seconds."""
    inc: dict[str, float] = {"stream_seconds": served_streams * dt_s}
    for p in pods:
        usd = p.cost_per_hr * dt_s / 3600
        inc["fleet_usd"] = inc.get("fleet_usd", 0.0) + usd
        inc["ondemand_equiv_usd"] = (
            inc.get("ondemand_equiv_usd", 0.0) + max(p.ondemand_per_hr, p.cost_per_hr) * dt_s / 3600
        )
        inc["pod_seconds"] = inc.get("pod_seconds", 0.0) + dt_s
        if p.spot:
            inc["spot_pod_seconds"] = inc.get("spot_pod_seconds", 0.0) + dt_s
        inc[f"tier:{p.tier}"] = inc.get(f"tier:{p.tier}", 0.0) + usd
    return inc


def serverless_spend(tier: str, usd: float) -> dict[str, float]:
    """Increments for ``usd`` of execution charged to a job on ``tier``'s serverless
    endpoint (nothing for nothing: a pass that charged no new second)."""
    if not usd > 0:
        return {}
    return {"fleet_usd": usd, "ondemand_equiv_usd": usd, "serverless_usd": usd,
            f"tier:{tier}": usd}  # fmt: skip
