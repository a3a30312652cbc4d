"""Progress lines and summary tables for humans."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from ingest.stream import IngestStream


def percentile(values: Iterable[float], q: float) -> float:
    arr = np.fromiter(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


DROP_REASONS = (
    "no_credit", "behind", "replaced", "disconnected", "timeout", "worker_error", "out_of_range",
)  # fmt: skip
"""Decoded frames that never got a result (sampling by design is not a drop)."""


def _drops(stream: IngestStream) -> int:
    return sum(stream.counters[k] for k in DROP_REASONS)


class Progress:
    """Rolling totals across streams for a one-line progress display."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._last_t = self.started
        self._last_results = 0

    def line(self, streams: Sequence[IngestStream]) -> str:
        now = time.monotonic()
        total = {k: sum(s.counters[k] for s in streams) for k in ("decoded", "sent", "results")}
        drops = sum(_drops(s) for s in streams)
        fps = (total["results"] - self._last_results) / max(now - self._last_t, 1e-6)
        self._last_t, self._last_results = now, total["results"]
        lat = [v for s in streams for v in s.latency_ms.last(500)]
        return (
            f"[{now - self.started:6.1f}s] decoded {total['decoded']:6d}  sent {total['sent']:6d}  "
            f"results {total['results']:6d}  drops {drops:5d}  {fps:6.1f} fps  "
            f"latency p50 {percentile(lat, 50):6.1f} ms  p99 {percentile(lat, 99):6.1f} ms"
        )


SUMMARY_COLUMNS = (
    ("stream", 14), ("state", 8), ("decoded", 8), ("sampled", 8), ("sent", 7),
    ("results", 8), ("drops", 6), ("fps", 6), ("p50 ms", 7), ("p99 ms", 7), ("objects", 8),
)  # fmt: skip


def summary_table(
    streams: Sequence[IngestStream], elapsed_s: float, objects: dict[str, int]
) -> str:
    """A fixed-width table, one row per stream plus drop reasons."""
    head = "  ".join(name.rjust(width) for name, width in SUMMARY_COLUMNS)
    rows = [head, "-" * len(head)]
    for s in streams:
        c = s.counters
        drops = _drops(s)
        lat = list(s.latency_ms)
        cells = (
            s.id[:14], s.state.value[:8], c["decoded"], c["prepared"], c["sent"], c["results"],
            drops, f"{c['results'] / max(elapsed_s, 1e-6):.1f}", f"{percentile(lat, 50):.1f}",
            f"{percentile(lat, 99):.1f}", objects.get(s.id, 0),
        )  # fmt: skip
        rows.append(
            "  ".join(str(v).rjust(w) for v, (_, w) in zip(cells, SUMMARY_COLUMNS, strict=True))
        )
    reasons = ("sampled_out", "no_pts", *DROP_REASONS, "decode_error", "encode_error", "corrupt")
    for s in streams:
        nonzero = {k: s.counters[k] for k in reasons if s.counters[k]}
        if nonzero or s.error:
            detail = ", ".join(f"{k}={v}" for k, v in nonzero.items())
            rows.append(f"  {s.id}: {detail}" + (f"  error: {s.error}" if s.error else ""))
    return "\n".join(rows)
