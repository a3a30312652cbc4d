"""How long a full garbage collection stops the ingest with a full result history.

    python bench/gc_pause.py [--streams 8] [--history 1024] [--repeat 7]

A full (generation 2) collection runs with the event loop stopped, so every
stream's frames wait for it. The ingest keeps the last ``--history`` results
of each stream for resuming subscribers. This fills a real ``ResultBus`` (the
history as id + JSON text) and, in the same run, the same results held as
record objects (what the history held before), then times ``gc.collect()``
over each, on top of this process's own heap (the modules, a few 10k objects).
Prints the median pause and the ratio to the baseline. Writes
``bench/results/gc_pause.json`` and ``gc_pause.png``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import write_results  # noqa: E402
from bench.rig.records import result_record  # noqa: E402
from ingest.bus import Published, ResultBus  # noqa: E402


def pause_ms(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def fill(
    bus: ResultBus,
    streams: int,
    history: int,
    *,
    first_seq: int,
    keep: collections.deque[Published] | None = None,
) -> None:
    """``history`` results per stream through ``bus``; ``keep`` also holds them as objects."""
    for seq in range(first_seq, first_seq + history):
        for s in range(streams):
            item = bus.push(result_record(f"cam-{s}", seq))
            if keep is not None:
                keep.append(item)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=8, help="streams (1-1000)")
    ap.add_argument("--history", type=int, default=1024, help="results kept per stream (1-100000)")
    ap.add_argument("--repeat", type=int, default=7, help="collections timed per case (1-100)")
    args = ap.parse_args()
    for name, top in (("streams", 1000), ("history", 100_000), ("repeat", 100)):
        if not 1 <= getattr(args, name) <= top:
            ap.error(f"--{name} must be 1-{top}")
    empty = pause_ms(args.repeat)
    bus = ResultBus(history=args.history)
    fill(bus, args.streams, args.history, first_seq=0)
    held = len(gc.get_objects())
    ours = pause_ms(args.repeat)
    # the baseline: the next results also held as record objects, as the history did
    objects: collections.deque[Published] = collections.deque()
    fill(bus, args.streams, args.history, first_seq=args.history, keep=objects)
    tracked = len(gc.get_objects()) - held
    before = pause_ms(args.repeat)
    results = {
        "args": vars(args), "empty_ms": empty, "history_as_text_ms": ours,
        "history_as_records_ms": before, "records_tracked_objects": tracked,
        "ratio_text_to_records": ours / before,
    }  # fmt: skip
    print(
        f"full collection, median of {args.repeat}: no history {empty:.1f} ms; "
        f"{args.streams} x {args.history} results as text {ours:.1f} ms; the same as records "
        f"{before:.1f} ms ({tracked} more tracked objects); ratio {ours / before:.2f}"
    )
    write_results("gc_pause", results, plot)
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """The median full-collection pause of each case."""
    ax = fig.subplots()
    names = ("no history", "history as text\n(the ingest)", "history as records\n(before)")
    ms = (results["empty_ms"], results["history_as_text_ms"], results["history_as_records_ms"])
    bars = ax.bar(names, ms, color=("tab:gray", "tab:green", "tab:red"))
    ax.bar_label(bars, fmt="%.1f ms")
    a = results["args"]
    title = f"full collection, {a['streams']} streams x {a['history']} results"
    ax.set(ylabel="gc.collect() pause, median (ms)", title=title)


if __name__ == "__main__":
    raise SystemExit(main())
