"""Latency under about 4x overload: does it grow, or does the excess become drops?

    python bench/overload.py [--repeat 3] [--overload 4] [--max-streams 18] [--no-pin]

Issue 2's acceptance, measured as it reads: a 1-thread ``framerelay worker``
process's capacity is measured (one file as fast as credits allow); one
real-time stream alone gives the unloaded p99; then enough real-time streams
(the sample clip at 25 fps, every frame) to offer ``--overload`` x capacity
share the worker for 60 s. Per run it prints the p99 of the first and the last
20 s and their ratio (target <= 1.2), the bound 1.5 x streams x unloaded p99,
and beside them the frames in the system (results/s x mean latency) and the
worker's own speed in each window, so a ratio moved by the CPU's speed can be
told from one moved by a queue.

By default the worker is pinned to the last core and the ingest (this
process) to the others, as across clouds they never share cores. Writes
``bench/results/overload.json``.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import write_results  # noqa: E402
from bench.rig.overload import Overload, Window, measure  # noqa: E402
from framerelay.launcher import LocalWorker  # noqa: E402
from framerelay.settings import DEFAULT_MODEL  # noqa: E402


def _window(w: Window) -> dict[str, float]:
    return {
        **asdict(w),
        "in_flight": w.in_flight,
        "p50_frames": w.p50_frames,
        "p99_frames": w.p99_frames,
    }


def _summary(o: Overload) -> dict[str, object]:
    f, la, u = o.first, o.last, o.unloaded
    return {
        "capacity_fps": o.capacity, "streams": o.streams, "offered_fps": o.offered_fps,
        "served_fps": o.served_fps, "unloaded_p99_ms": u.p99_ms,
        "first": _window(f), "last": _window(la),
        "p99_ratio": la.p99_ms / f.p99_ms, "in_flight_ratio": la.in_flight / f.in_flight,
        "p99_frames_ratio": la.p99_frames / f.p99_frames, "speed_ratio": la.rate / f.rate,
        "bound_ms": o.bound_ms, "under_bound": max(f.p99_ms, la.p99_ms) < o.bound_ms,
        "replaced": sum(c["replaced"] for c in o.loaded.counts.values()),
        "sent": sum(c["sent"] for c in o.loaded.counts.values()),
        "results": sum(c["results"] for c in o.loaded.counts.values()),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--overload", type=float, default=4.0, help="offered / capacity")
    ap.add_argument("--max-streams", type=int, default=18)
    ap.add_argument("--no-pin", action="store_true", help="let worker and ingest share cores")
    args = ap.parse_args()
    secret = secrets.token_urlsafe(32)
    runs: list[dict[str, object]] = []
    worker_args = ["--model", str(DEFAULT_MODEL), "--threads", "1"]
    with LocalWorker(secret, worker_id="test-worker", args=worker_args) as worker:
        assert worker.proc is not None
        for i in range(args.repeat):
            print(f"run {i + 1}/{args.repeat} (about 100 s) ...", flush=True)
            o = measure(
                worker.url, secret, worker.proc.pid,
                overload=args.overload, max_streams=args.max_streams, pin=not args.no_pin,
            )  # fmt: skip
            print(o.report() + "\n", flush=True)
            runs.append(_summary(o))
    ratios = [float(str(r["p99_ratio"])) for r in runs]
    flights = [float(str(r["in_flight_ratio"])) for r in runs]
    under = sum(1 for r in runs if r["under_bound"])
    print(
        f"median of {len(runs)} runs: p99 last/first {statistics.median(ratios):.2f} "
        f"(runs {min(ratios):.2f}-{max(ratios):.2f}, target <= 1.2); frames in flight "
        f"last/first {statistics.median(flights):.2f}; p99 under the bound in {under}/{len(runs)}"
    )
    write_results("overload", {"args": vars(args), "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
