"""Latency under about 4x overload: does it grow, or does the excess become drops?

    python bench/overload.py [--repeat 3] [--overload 4] [--max-streams 18] [--no-pin]

Issue 2's acceptance, measured as it reads: a 1-thread ``framerelay worker``
process's capacity is measured (one file as fast as credits allow); one
real-time stream alone (every frame, or half the capacity where that is below
25 fps) gives the unloaded p99; then enough real-time streams (the sample clip
at 25 fps, every frame) to offer ``--overload`` x capacity share the worker for
60 s. Per run it prints the p99 of the first and the last 20 s and their ratio
(target <= 1.2), each over the unloaded p99 against the bound 1.5 x streams,
the share of frames replaced alone and loaded, and beside them the frames in
the system (results/s x mean latency) and the worker's own speed in each
window, so a ratio moved by the CPU's speed can be told from one moved by a
queue. ``tests/integration/test_overload.py`` judges the same rig in frames
only; these milliseconds are this bench's.

By default the worker is pinned to the last core and the ingest (this
process) to the others, as across clouds they never share cores. Writes
``bench/results/overload.json`` and ``overload.png`` (p99 and frames in flight
of the first and last 20 s of each run, against the bound).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
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
        "alone_fps": o.alone_fps, "alone_replaced": o.alone_replaced,
        "loaded_replaced": o.loaded_replaced,
        "replaced": sum(c["replaced"] for c in o.loaded.counts.values()),
        "sent": sum(c["sent"] for c in o.loaded.counts.values()),
        "results": sum(c["results"] for c in o.loaded.counts.values()),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs of about 100 s (1-20)")
    ap.add_argument("--overload", type=float, default=4.0, help="offered / capacity (1-20)")
    ap.add_argument("--max-streams", type=int, default=18, help="at most this many streams (1-64)")
    ap.add_argument("--no-pin", action="store_true", help="let worker and ingest share cores")
    args = ap.parse_args()
    if not (1 <= args.repeat <= 20 and 1 <= args.overload <= 20 and 1 <= args.max_streams <= 64):
        ap.error("--repeat must be 1-20, --overload 1-20 and --max-streams 1-64")
    secret = secrets.token_urlsafe(32)
    runs: list[dict[str, object]] = []
    worker_args = ["--model", str(DEFAULT_MODEL), "--threads", "1"]
    with (
        LocalWorker(secret, worker_id="test-worker", args=worker_args) as worker,
        Progress(args.repeat, "overload", "runs") as bar,
    ):
        assert worker.proc is not None
        for i in range(args.repeat):
            print(f"run {i + 1}/{args.repeat} (about 100 s) ...", flush=True)
            o = measure(
                worker.url, secret, worker.proc.pid,
                overload=args.overload, max_streams=args.max_streams, pin=not args.no_pin,
            )  # fmt: skip
            print(o.report() + "\n", flush=True)
            runs.append(_summary(o))
            bar.advance()
    ratios = [float(str(r["p99_ratio"])) for r in runs]
    flights = [float(str(r["in_flight_ratio"])) for r in runs]
    under = sum(1 for r in runs if r["under_bound"])
    print(
        f"median of {len(runs)} runs: p99 last/first {statistics.median(ratios):.2f} "
        f"(runs {min(ratios):.2f}-{max(ratios):.2f}, target <= 1.2); frames in flight "
        f"last/first {statistics.median(flights):.2f}; p99 under the bound in {under}/{len(runs)}"
    )
    write_results("overload", {"args": vars(args), "runs": runs}, plot)
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Per run: p99 of the first and last 20 s against the bound; frames in flight."""
    p99, flight = fig.subplots(1, 2)
    runs = results["runs"]
    x = range(len(runs))
    for ax, key, unit in ((p99, "p99_ms", "p99 latency (ms)"), (flight, "in_flight", "frames")):
        ax.bar([i - 0.2 for i in x], [r["first"][key] for r in runs], 0.4, label="first 20 s")
        ax.bar([i + 0.2 for i in x], [r["last"][key] for r in runs], 0.4, label="last 20 s")
        ax.set_xticks(list(x), [f"run {i + 1}\n{r['streams']} streams" for i, r in enumerate(runs)])
        top = max(
            max(r["first"][key], r["last"][key], r["bound_ms"] if ax is p99 else 0) for r in runs
        )
        ax.set(ylabel=unit, ylim=(0, 1.35 * top))
    p99.scatter(list(x), [r["bound_ms"] for r in runs], marker="_", s=900, color="tab:red",
                label="bound: 1.5 x streams x unloaded p99", zorder=3)  # fmt: skip
    p99.set_title(f"p99 at {results['args']['overload']:g}x capacity (last/first target <= 1.2)")
    flight.set_title("frames in the system (Little's law)")
    p99.legend(loc="upper center", ncols=2, fontsize="small")
    flight.legend(loc="upper center", ncols=2, fontsize="small")


if __name__ == "__main__":
    raise SystemExit(main())
