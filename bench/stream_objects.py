"""Which fault leaves a stream object behind in the ingest after its stream was deleted?

    python bench/stream_objects.py [--repeat 2]

Issue 11's soaks found the ingest's live memory growing with the count of its
``IngestStream`` objects (7 -> 14 over 37 minutes of faults, while the API listed
the same streams). This runs the soak's rig (:mod:`bench.rig.matrix_harness`) with
the memory probe (``bench/rig/heap_probe``, one line every 2 s) loaded into the
ingest, runs each fault of the soak's rotation ``--repeat`` times, and prints how
many stream objects (and Preparers, sources, tasks) are alive after each: a fault
that leaks one leaves the count one higher every time.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rig.matrix_harness import run_scenario, running_rig  # noqa: E402
from bench.soak import rotation  # noqa: E402

SETTLE_S = 6.0


def counts(probe: Path) -> dict[str, int]:
    """The objects counted on the probe's last line."""
    time.sleep(SETTLE_S)  # three probe lines: the stream's threads have ended
    last = probe.read_text().splitlines()[-1]
    parsed: dict[str, int] = ast.literal_eval(last[last.index("{") :])
    return parsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--repeat", type=int, default=2, help="runs of each fault (1-10)")
    args = ap.parse_args()
    repeat = max(1, min(args.repeat, 10))
    with tempfile.TemporaryDirectory(prefix="framerelay-objects-") as tmp:
        root, out = Path(tmp), Path(tmp) / "probe"
        env = {
            "PYTHONPATH": str(ROOT / "bench/rig/heap_probe"),
            "FRAMERELAY_HEAP_PROBE_OUT": str(out),
            "FRAMERELAY_HEAP_PROBE_EVERY_S": "2",
        }
        from bench.rig import matrix_faults as faults

        faults.make_media(root)
        with running_rig(root, healthy=4, fps=3, ingest_env=env) as rig:
            before = counts(out / "probe.log")
            print(f"start: {before}", flush=True)
            for name, setup, scenario in rotation():
                for run in range(repeat):
                    run_scenario(rig, name, scenario, setup=setup)
                    now = counts(out / "probe.log")
                    grew = now.get("IngestStream", 0) - before.get("IngestStream", 0)
                    print(
                        f"{name:34s} run {run + 1}: IngestStream {now.get('IngestStream')} "
                        f"({grew:+d} since start), Preparer {now.get('Preparer')}, "
                        f"AVSource {now.get('AVSource')}, Task {now.get('Task')}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
