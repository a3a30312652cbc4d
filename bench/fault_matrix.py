"""The fault matrix's latency and rate figures, on a machine to itself.

    python bench/fault_matrix.py [--repeat 1] [--only 401,8K]

Issue 11's acceptance in milliseconds: the matrix's rig (:mod:`bench.rig.matrix_harness`:
two CPU workers with the real model, one ingest, two healthy real-time streams and a
results subscriber) takes each fault of the matrix in turn (the soak's rotation), and
for each the healthy streams must keep >= 95 % of their result rate of the seconds
before the fault and a p99 latency within max(2 x p99 before, p99 before + 50 ms).

``tests/faults/test_fault_matrix.py`` runs the same scenarios and judges them by
behaviour only (every healthy frame answered, the streams running and not starved, the
bad stream's state, every process alive, RSS back): these two figures move with the
machine's load, so they are this bench's. Run it with nothing else on the machine.
Prints one line per fault and healthy stream with the rate kept and the p99 ratio
(during / before) beside their bounds; writes ``bench/results/fault_matrix.json``.
Exit status 1 when a figure misses its bound.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench.rig import matrix_faults as faults  # noqa: E402
from bench.rig.matrix_harness import Rig, run_scenario, running_rig  # noqa: E402
from bench.rig.matrix_results import KEPT_MIN_PCT, Figures, HealthyFigures  # noqa: E402
from bench.soak import rotation  # noqa: E402

LATENCY_FACTOR = 2.0


def _row(figures: Figures, h: HealthyFigures) -> dict[str, Any]:
    before = h.before.p99_ms
    return {
        "fault": figures.name,
        "stream": h.stream,
        "kept_pct": h.kept_pct,
        "p99_before_ms": before,
        "p99_during_ms": h.during.p99_ms,
        "p99_ratio": h.during.p99_ms / before if before else float("nan"),
        "bound_ms": h.bound_ms,
        "ok": not h.problems(),
    }


def run(rig: Rig, args: argparse.Namespace, bar: Progress) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, setup, scenario in rotation():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        for _ in range(args.repeat):
            figures = run_scenario(rig, name, scenario, setup=setup, latency_factor=LATENCY_FACTOR)
            bar.advance()
            for h in figures.healthy:
                rows.append(_row(figures, h))
                print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    verdict = "ok" if row["ok"] else "MISSED"
    return (
        f"{row['fault']:34s} {row['stream']:10s} kept {row['kept_pct']:5.1f} % "
        f"(>= {KEPT_MIN_PCT:.0f}), p99 {row['p99_before_ms']:4.0f} -> "
        f"{row['p99_during_ms']:4.0f} ms = x{row['p99_ratio']:.2f} "
        f"(bound {row['bound_ms']:.0f} ms) {verdict}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of each fault (1-10)")
    ap.add_argument(
        "--only",
        type=lambda s: [p for p in s.split(",") if p],
        default=[],
        help="faults whose name contains one of these (comma-separated)",
    )
    args = ap.parse_args()
    if not 1 <= args.repeat <= 10:
        ap.error("--repeat must be 1-10")
    chosen = [
        n
        for n, _, _ in rotation()
        if not args.only or any(o.lower() in n.lower() for o in args.only)
    ]
    if not chosen:
        ap.error(f"--only matches no fault; the faults: {', '.join(n for n, _, _ in rotation())}")
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
        root = Path(tmp)
        faults.make_media(root)
        with running_rig(root) as rig, Progress(len(chosen) * args.repeat, "faults") as bar:
            rows = run(rig, args, bar)
    missed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} healthy-stream figures within bounds")
    write_results(
        "fault_matrix",
        {"rows": rows, "latency_factor": LATENCY_FACTOR, "kept_min_pct": KEPT_MIN_PCT},
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
