"""What the console's streams table shows: one row per stream, from the live counters.

Rates are differences of the stream's counters between two reads (the console
reads once a second); latency (its SLO, the clock it is measured from,
percentiles of recent results, breaches) is the stream's own
(:class:`ingest.latency.StreamLatency`). A row is a plain dict; the rows are built and encoded
once per second and shared by every console watching (:class:`ingest.console.TableFeed`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.stats import DROP_REASONS
from ingest.stream import IngestStream

DROPS = DROP_REASONS
"""Frames lost after the source gave them, as the progress line and ``/v1/history`` count
them (``sampled_out`` is the sampling the stream asked for, not a drop)."""


@dataclass
class Rates:
    """Counter readings of the previous call, per stream, to turn counters into rates."""

    seen: dict[str, tuple[float, dict[str, int]]] = field(default_factory=dict)

    def per_s(self, stream: IngestStream, now: float) -> dict[str, float]:
        """decoded, sent and results per second since the last call (0 on the first)."""
        counters = stream.counters
        before = self.seen.get(stream.id)
        self.seen[stream.id] = (now, dict(counters))
        if before is None or now <= before[0]:
            return {"decoded": 0.0, "sent": 0.0, "results": 0.0}
        dt = now - before[0]
        return {k: max(0, counters[k] - before[1].get(k, 0)) / dt for k in ("decoded", "sent",
                                                                            "results")}  # fmt: skip

    def forget_except(self, ids: Mapping[str, object]) -> None:
        for sid in [s for s in self.seen if s not in ids]:
            del self.seen[sid]


def stream_row(
    stream: IngestStream, rates: Rates, worker: str | None, now: float
) -> dict[str, Any]:
    """One row of the streams table."""
    per_s = rates.per_s(stream, now)
    counters = stream.counters
    drops = {k: counters[k] for k in DROPS if counters.get(k)}
    latency = stream.latency.describe()  # SLO, clock, p50/p99 of recent results, breaches
    return {
        "id": stream.id,
        "source": stream.spec.display,
        "state": stream.state.value,
        "since": stream.state_since,
        "error": stream.stalled or stream.error,
        "epoch": stream.epoch,
        "fps": stream.config.fps,
        "fps_in": round(per_s["decoded"], 2),
        "fps_sent": round(per_s["sent"], 2),
        "fps_out": round(per_s["results"], 2),
        "results": counters["results"],
        "drops": drops,
        "dropped": sum(drops.values()),
        "latency_p50_ms": _rounded(latency["latency_p50_ms"]),
        "latency_p99_ms": _rounded(latency["latency_p99_ms"]),
        "latency_slo_ms": latency["latency_slo_ms"],
        "latency_from": latency["latency_from"],
        "slo_breaches": latency["slo_breaches"],
        "worker": worker,
    }


def _rounded(value: object) -> float | None:
    return round(value, 1) if isinstance(value, float) else None


def snapshot(
    streams: Mapping[str, IngestStream],
    where: Mapping[str, str],
    default: str | None,
    rates: Rates,
) -> list[dict[str, Any]]:
    """Every stream's row, by id."""
    now = time.monotonic()
    rows = [
        stream_row(s, rates, where.get(sid, default), now) for sid, s in sorted(streams.items())
    ]
    rates.forget_except(streams)
    return rows
