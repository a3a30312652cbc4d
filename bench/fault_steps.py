"""Does a fault leave memory behind each time it happens, or once?

    python bench/fault_steps.py [--repeat 5] [--only NAME[,NAME]] [--streams 4] [--fps 3]

The soak (``bench/soak.py``) answers "does anything grow" with one slope, where
a fault every 2 minutes and an RSS that wanders by a few MB are hard to tell
apart. This bench asks each fault on its own: the fault matrix's rig
(:mod:`bench.rig.matrix_harness`: two CPU workers, one ingest, ``--streams``
real-time streams and a results subscriber) runs each fault of the soak's
rotation ``--repeat`` times in a row, and after each run takes every process's
*settled* RSS: ``--quiet-s`` seconds without a fault, then the median of one
sample a second for ``--settle-s`` seconds (anonymous resident memory,
``RssAnon``). Then ``--repeat`` quiet spells without any fault give the
baseline wander.

Printed per fault and process: the step of the first run (one-time costs:
code paths used for the first time) and the mean step of the later runs. A
fault that leaks leaves the same step at every run; one that only warms up
leaves steps around zero after its first. Writes
``bench/results/<name>.json`` and ``<name>.png`` (settled RSS after each run).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench.rig import matrix_faults as faults  # noqa: E402
from bench.rig.matrix_harness import Rig, run_scenario, running_rig  # noqa: E402
from bench.soak import rotation  # noqa: E402

QUIET = "no fault (baseline)"


def rss_anon_mb(pid: int) -> float:
    """Anonymous resident memory of ``pid`` in MB (heap, not mapped files)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def settled(rig: Rig, quiet_s: float, settle_s: float) -> dict[str, float]:
    """Each process's median RssAnon over ``settle_s`` s, after ``quiet_s`` s of quiet."""
    time.sleep(quiet_s)
    pids = rig.pids()
    samples: dict[str, list[float]] = {name: [] for name in pids}
    for _ in range(max(1, round(settle_s))):
        for name, pid in pids.items():
            samples[name].append(rss_anon_mb(pid))
        time.sleep(1.0)
    return {name: round(statistics.median(v), 2) for name, v in samples.items()}


def steps(levels: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per process, the change of settled RSS from each level to the next."""
    names = [n for n in levels[0] if all(n in lv for lv in levels)]
    return {n: [round(b[n] - a[n], 2) for a, b in itertools.pairwise(levels)]
            for n in names}  # fmt: skip


def summary(fault_steps: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """First step and mean of the later ones, per process."""
    out = {}
    for name, s in fault_steps.items():
        later = s[1:]
        out[name] = {"first": s[0] if s else float("nan"),
                     "later_mean": statistics.fmean(later) if later else float("nan"),
                     "net": sum(s)}  # fmt: skip
    return out


def run(rig: Rig, args: argparse.Namespace, bar: Progress) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    level = settled(rig, args.quiet_s, args.settle_s)
    for name, setup, scenario in rotation():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        levels = [level]
        for k in range(args.repeat):
            run_scenario(rig, name, scenario, setup=setup)
            levels.append(settled(rig, args.quiet_s, args.settle_s))
            bar.advance()
            print(f"{name} run {k + 1}: settled RSS {levels[-1]}", flush=True)
        rows.append(_row(name, levels))
        level = levels[-1]
    levels = [level]
    for _ in range(args.repeat):
        levels.append(settled(rig, args.quiet_s, args.settle_s))
        bar.advance()
    rows.append(_row(QUIET, levels))
    return rows


def _row(name: str, levels: list[dict[str, float]]) -> dict[str, Any]:
    s = steps(levels)
    summed = summary(s)
    row: dict[str, Any] = {"fault": name, "levels": levels, "steps": s, "summary": summed}
    ingest = summed.get("ingest", {})
    print(f"== {name}: ingest first {ingest.get('first', 0):+.2f} MB, later runs "
          f"{ingest.get('later_mean', 0):+.2f} MB each", flush=True)  # fmt: skip
    return row


def report(rows: list[dict[str, Any]]) -> None:
    names = list(rows[0]["summary"]) if rows else []
    print("\nsettled RSS step per run, MB (first run / mean of the later runs):")
    print(f"  {'fault':34s}" + "".join(f"{n:>20s}" for n in names))
    for row in rows:
        cells = "".join(_cell(row["summary"][n]) for n in names)
        print(f"  {row['fault']:34s}{cells}")


def _cell(s: dict[str, float]) -> str:
    return f"{s['first']:>+9.2f} / {s['later_mean']:>+7.2f} "


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Settled RSS after each run, one panel per process, faults in order."""
    rows = results["rows"]
    names = list(rows[0]["summary"]) if rows else []
    fig.set_size_inches(10, 2 + 2.5 * max(1, len(names)))
    axes = fig.subplots(max(1, len(names)), 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(f"settled RSS after each of {results['repeat']} runs of each fault")
    for ax, name in zip(axes, names, strict=False):
        x, y, ticks = 0, [], []
        for row in rows:
            values = [lv[name] for lv in row["levels"][1:] if name in lv]
            ax.plot(range(x, x + len(values)), values, marker="o", ms=3)
            ticks.append((x, row["fault"]))
            x += len(values)
            y += values
        ax.set_ylabel("MB")
        ax.set_title(name, fontsize="medium", loc="left")
    axes[-1].set_xticks([t for t, _ in ticks], [n for _, n in ticks], rotation=60,
                        fontsize=6, ha="right")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each fault (2-50)")
    parser.add_argument(
        "--only",
        type=lambda s: s.split(","),
        default=None,
        help="faults whose names contain one of these (comma-separated)",
    )
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--fps", type=float, default=3.0)
    parser.add_argument("--quiet-s", type=float, default=12.0, help="quiet before measuring")
    parser.add_argument("--settle-s", type=float, default=7.0, help="seconds of 1 s samples")
    parser.add_argument("--name", default="fault_steps", help="results file name")
    args = parser.parse_args()  # fmt: skip
    args.repeat = max(2, min(args.repeat, 50))
    total = args.repeat * (1 + sum(
        1 for name, _, _ in rotation()
        if not args.only or any(o.lower() in name.lower() for o in args.only)))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="framerelay-steps-") as tmp:
        root = Path(tmp)
        faults.make_media(root)
        with running_rig(root, healthy=args.streams, fps=args.fps) as rig, \
                Progress(total, "fault steps", "runs") as bar:  # fmt: skip
            rows = run(rig, args, bar)
    report(rows)
    write_results(args.name, {"repeat": args.repeat, "streams": args.streams,
                              "fps": args.fps, "rows": rows}, plot)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
