"""Our trackers against roboflow ``trackers`` 2.6.1, in one process, on the same detections.

::

    .venv/bin/python bench/tracker.py [--model samples/models/yolox_nano_416.onnx]
                                      [--data samples/mot15] [--repeats 5]

1. Accuracy: on TUD-Campus and TUD-Stadtmitte, at every frame and every 5th
   frame, runs our trackers (``default`` and the named ones) and roboflow's
   ``ByteTrackTracker``, ``OCSORTTracker`` and ``SORTTracker`` at their
   defaults on the same cached YOLOX detections (person class, score >= 0.1),
   and scores them with :mod:`tracker.eval` (motmetrics). Roboflow's trackers
   run twice, once given the PTS timestamps and once in their fixed-frame-rate
   mode, and the better of the two counts as their result.
2. Speed: 20 and 100 synthetic detections per frame over 1,000 frames (25 fps),
   ours (``default``) against their ByteTrack, each timed ``--repeats`` times
   interleaved; the fastest repeat counts (the usual timeit practice). The
   clock is the process's CPU time (``time.process_time``), so time spent
   descheduled on a shared machine does not count for either side. Only
   ``update`` calls are timed, never input conversion.

Prints a table and writes ``bench/results/tracker.json`` and ``tracker.png``
(ours against the best roboflow tracker per sequence; speed). Needs the bench-only
packages ``trackers`` and ``supervision`` (and their imports: opencv-python-
headless, pillow, pyyaml, tqdm, defusedxml, rich, requests, pydeprecate).
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from framerelay.commands.eval_tracker import load_detections  # noqa: E402
from framerelay.detections import Detections  # noqa: E402
from tracker import create_tracker  # noqa: E402
from tracker import eval as ev  # noqa: E402

SEQUENCES = ("TUD-Campus", "TUD-Stadtmitte")
EVERY = (1, 5)
OURS = ("default", "hybrid", "bytetrack", "ocsort")
THEIRS = ("ByteTrackTracker", "OCSORTTracker", "SORTTracker")


@dataclass(frozen=True, slots=True)
class Row:
    sequence: str
    every: int
    tracker: str
    mota: float
    idf1: float
    id_switches: int
    us_per_update: float


# ------------------------------------------------------------------ roboflow side


def _theirs(name: str) -> Any:
    import trackers

    return getattr(trackers, name)()


def _run_theirs(
    name: str, frames: Sequence[ev.Frame], use_time: bool
) -> tuple[list[ev.FrameOutput], list[float]]:
    import supervision as sv

    trk = _theirs(name)
    inputs = [
        sv.Detections(
            xyxy=f.detections.xyxy.astype(np.float64),
            confidence=f.detections.confidence,
            class_id=f.detections.class_id,
        )
        for f in frames
    ]
    outputs: list[ev.FrameOutput] = []
    seconds: list[float] = []
    for f, d in zip(frames, inputs, strict=True):
        start = time.perf_counter()
        out = trk.update(d, timestamp=f.t if use_time else None)
        seconds.append(time.perf_counter() - start)
        ids = np.asarray(out.tracker_id, np.int64)
        keep = ids >= 0
        outputs.append(ev.FrameOutput(f.index, ids[keep], out.xyxy[keep].astype(np.float32)))
    return outputs, seconds


# ------------------------------------------------------------------ accuracy


def accuracy(model: Path, data: Path, bar: Progress) -> list[Row]:
    rows: list[Row] = []
    for seq in SEQUENCES:
        video, gt_path = data / seq / f"{seq}.mp4", data / seq / "gt" / "gt.txt"
        frames = load_detections(video, model, cache_dir=ROOT / ".cache" / "detections")
        gt = ev.load_gt(gt_path)
        for every in EVERY:
            kept = ev.select_frames(frames, every)
            for name in OURS:
                outs, secs = ev.run_tracker(create_tracker(name), kept)
                rows.append(_row(seq, every, name, ev.score(outs, gt), secs))
            for name in THEIRS:
                for use_time in (True, False):
                    outs, secs = _run_theirs(name, kept, use_time)
                    label = f"rf.{name.removesuffix('Tracker')}[{'pts' if use_time else 'frames'}]"
                    rows.append(_row(seq, every, label, ev.score(outs, gt), secs))
            bar.advance()
    return rows


def _row(seq: str, every: int, name: str, m: dict[str, float], secs: list[float]) -> Row:
    us = 1e6 * float(np.mean(secs)) if secs else 0.0
    return Row(seq, every, name, m["mota"], m["idf1"], int(m["num_switches"]), us)


def verdicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Our default against the best roboflow tracker, per sequence and sampling."""
    out: list[dict[str, Any]] = []
    for seq in SEQUENCES:
        for every in EVERY:
            cell = [r for r in rows if r.sequence == seq and r.every == every]
            ours = next(r for r in cell if r.tracker == "default")
            theirs = [r for r in cell if r.tracker.startswith("rf.")]
            best_mota = max(theirs, key=lambda r: r.mota)
            best_idf1 = max(theirs, key=lambda r: r.idf1)
            out.append(
                {
                    "sequence": seq,
                    "every": every,
                    "ours_mota": ours.mota,
                    "best_theirs_mota": best_mota.mota,
                    "best_theirs_mota_by": best_mota.tracker,
                    "ours_idf1": ours.idf1,
                    "best_theirs_idf1": best_idf1.idf1,
                    "best_theirs_idf1_by": best_idf1.tracker,
                    "pass": ours.mota >= best_mota.mota and ours.idf1 >= best_idf1.idf1,
                }
            )
    return out


# ------------------------------------------------------------------ speed


def synthetic(n_objects: int, frames: int, seed: int = 0, fps: float = 25.0) -> list[Detections]:
    """``n_objects`` boxes moving linearly (wrapping at the edges), jittered,
    with uniform confidences in [0.05, 1), i.e. about half of them 'low'."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform([0, 0], [1800, 1000], (n_objects, 2))
    vel = rng.normal(0, 40, (n_objects, 2))
    size = rng.uniform([20, 40], [80, 160], (n_objects, 2))
    out: list[Detections] = []
    for _ in range(frames):
        pos = (pos + vel / fps) % [1800, 1000]
        c = pos + rng.normal(0, 1.5, pos.shape)
        xyxy = np.column_stack([c - size / 2, c + size / 2]).astype(np.float32)
        conf = rng.uniform(0.05, 1.0, n_objects).astype(np.float32)
        out.append(Detections(xyxy, conf, np.zeros(n_objects, np.int32)))
    return out


def _time_ours(dets: Sequence[Detections], fps: float) -> float:
    trk = create_tracker("default")
    start = time.process_time()
    for k, d in enumerate(dets):
        trk.update(d, k / fps)
    return (time.process_time() - start) / len(dets)


def _time_theirs(dets: Sequence[Detections], fps: float) -> float:
    import supervision as sv

    inputs = [
        sv.Detections(xyxy=d.xyxy, confidence=d.confidence, class_id=d.class_id) for d in dets
    ]
    trk = _theirs("ByteTrackTracker")
    start = time.process_time()
    for k, d in enumerate(inputs):
        trk.update(d, timestamp=k / fps)
    return (time.process_time() - start) / len(inputs)


def speed(
    repeats: int, bar: Progress, frames: int = 1000, fps: float = 25.0
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for n in (20, 100):
        dets = synthetic(n, frames, fps=fps)
        timers: dict[str, Callable[[Sequence[Detections], float], float]] = {
            "ours": _time_ours,
            "theirs": _time_theirs,
        }
        best = {k: float("inf") for k in timers}
        for _ in range(repeats):
            for key, timer in timers.items():
                best[key] = min(best[key], timer(dets, fps))
        ratio = best["ours"] / best["theirs"]
        results.append(
            {
                "detections": n,
                "frames": frames,
                "ours_us": 1e6 * best["ours"],
                "theirs_bytetrack_us": 1e6 * best["theirs"],
                "ratio": ratio,
                "pass": ratio <= 1 / 3,
            }
        )
        bar.advance()
    return results


# ------------------------------------------------------------------ report


def _print(
    rows: Sequence[Row], verdict: Sequence[dict[str, Any]], sp: Sequence[dict[str, Any]]
) -> None:
    head = ("sequence", "every", "tracker", "MOTA", "IDF1", "IDsw", "us/upd")
    print("{:15} {:>5} {:26} {:>6} {:>6} {:>5} {:>8}".format(*head))
    for r in rows:
        print(
            f"{r.sequence:15} {r.every:5d} {r.tracker:26} {r.mota:6.3f} {r.idf1:6.3f} "
            f"{r.id_switches:5d} {r.us_per_update:8.1f}"
        )
    print("\nours (default) vs best roboflow tracker on the same detections")
    for v in verdict:
        print(
            f"{v['sequence']:15} every {v['every']}: MOTA {v['ours_mota']:.3f} vs "
            f"{v['best_theirs_mota']:.3f} ({v['best_theirs_mota_by']}), ratio "
            f"{v['ours_mota'] / v['best_theirs_mota']:.3f}; IDF1 {v['ours_idf1']:.3f} vs "
            f"{v['best_theirs_idf1']:.3f} ({v['best_theirs_idf1_by']}), ratio "
            f"{v['ours_idf1'] / v['best_theirs_idf1']:.3f}  -> {'PASS' if v['pass'] else 'FAIL'}"
        )
    print("\nspeed, synthetic detections (best of repeats)")
    for s in sp:
        print(
            f"{s['detections']:4d} dets x {s['frames']} frames: "
            f"ours {s['ours_us']:8.1f} us/update, "
            f"their ByteTrack {s['theirs_bytetrack_us']:8.1f} us/update, ratio {s['ratio']:.3f} "
            f"(target <= 0.333) -> {'PASS' if s['pass'] else 'FAIL'}"
        )


NEEDS = ("trackers", "supervision")
INSTALL = ".venv/bin/pip install --no-deps trackers==2.6.1 supervision (see bench/README.md)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, default=ROOT / "samples/models/yolox_nano_416.onnx")
    p.add_argument("--data", type=Path, default=ROOT / "samples/mot15", help="MOT15 sequences")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of the speed half (1-50)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/tracker.json",
                   help="the JSON (the PNG goes beside it)")  # fmt: skip
    p.add_argument("--only", choices=("accuracy", "speed"), help="run one half (for quick checks)")
    args = p.parse_args(argv)
    if missing := [m for m in NEEDS if importlib.util.find_spec(m) is None]:
        p.error(f"needs {' and '.join(missing)}: {INSTALL}")
    if not 1 <= args.repeats <= 50:
        p.error("--repeats must be 1-50")
    if args.only != "speed" and not (args.model.is_file() and args.data.is_dir()):
        p.error(f"no model {args.model} or no sequences in {args.data}")
    if args.out.suffix != ".json":
        p.error(f"--out must end in .json: {args.out}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    steps = (len(SEQUENCES) * len(EVERY) if args.only != "speed" else 0) + (
        2 if args.only != "accuracy" else 0
    )
    with Progress(steps, "tracker", "steps") as bar:
        rows = accuracy(args.model, args.data, bar) if args.only != "speed" else []
        verdict = verdicts(rows) if rows else []
        sp = speed(args.repeats, bar) if args.only != "accuracy" else []
    _print(rows, verdict, sp)
    import trackers

    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "roboflow_trackers": getattr(trackers, "__version__", "2.6.1"),
        "accuracy": [asdict(r) for r in rows],
        "verdict": verdict,
        "speed": sp,
    }
    print()
    write_results(args.out.stem, result, plot, folder=args.out.parent)
    ok = all(v["pass"] for v in verdict) and all(s["pass"] for s in sp)
    return 0 if ok else 1


SCORES = (("ours_mota", "MOTA ours"), ("best_theirs_mota", "MOTA best roboflow"),
          ("ours_idf1", "IDF1 ours"), ("best_theirs_idf1", "IDF1 best roboflow"))  # fmt: skip


def plot(fig: Figure, result: dict[str, Any]) -> None:
    """MOTA and IDF1 of ours vs the best roboflow tracker per sequence and sampling; speed."""
    verdict, sp = result["verdict"], result["speed"]
    ratios = [1.6] * bool(verdict) + [1.0] * bool(sp)
    panels = fig.subplots(1, len(ratios), squeeze=False, width_ratios=ratios)[0]
    if verdict:
        ax, cells = (
            panels[0],
            [f"{v['sequence'].removeprefix('TUD-')}\nevery {v['every']}" for v in verdict],
        )
        x = range(len(verdict))
        for k, (key, label) in enumerate(SCORES):
            ax.bar([i + (k - 1.5) * 0.2 for i in x], [v[key] for v in verdict], 0.2, label=label)
        ax.set_xticks(list(x), cells)
        ax.set(ylabel="score", ylim=(0, 1.15), title="accuracy on the same detections")
        ax.legend(loc="upper center", ncols=2, fontsize="small")
    if sp:
        ax = panels[-1]
        x = range(len(sp))
        ax.bar([i - 0.2 for i in x], [s["ours_us"] for s in sp], 0.4, label="ours (default)")
        ax.bar([i + 0.2 for i in x], [s["theirs_bytetrack_us"] for s in sp], 0.4,
               label="roboflow ByteTrack")  # fmt: skip
        ax.set_xticks(list(x), [f"{s['detections']} detections" for s in sp])
        ax.set(ylabel="CPU us per update (best repeat)", title="speed")
        ax.legend()


if __name__ == "__main__":
    raise SystemExit(main())
