"""Our trackers against roboflow ``trackers`` 2.6.1, in one process, on the same detections.

::

    .venv/bin/python bench/tracker.py [--model samples/models/yolox_nano_416.onnx]
        [--data ../shared/data] [--sequence NAME ...] [--repeats 5] [--only accuracy|speed]
        [--set KEY=JSON ...]

1. Accuracy on the development set (``bench/_devset.py``): every sequence under
   ``--data`` (TUD-Campus, TUD-Stadtmitte, KITTI-17, MOT16-09), each at every
   frame, every 2nd, every 5th frame and with 20 % of its frames dropped at
   random (seeded per sequence): a *cell*. In each cell our trackers (every
   registered mode, ``default`` first) and roboflow's ``ByteTrackTracker``,
   ``OCSORTTracker`` and ``SORTTracker`` (at their defaults, built with the
   stream's real frame rate, once given timestamps and once in their
   fixed-frame-rate mode) run on the same cached YOLOX detections (person class,
   score >= 0.1) and are scored by :mod:`tracker.eval` (MOTA, IDF1, HOTA as
   TrackEval defines them; MOT16 ground truth with its distractor preprocessing).
   For every cell and mode it prints ours / the best roboflow run, per metric
   (the best may be a different run for each metric), and per mode the minimum
   ratio over all cells and metrics: the figure issue 16 chooses the default by.
   Detections are cached in ``.cache/detections`` (the detector is the slow part).
2. Speed: 20 and 100 synthetic detections per frame over 1,000 frames (25 fps),
   ours (``default``) against their ByteTrack, each timed ``--repeats`` times
   interleaved; the fastest repeat counts (the usual timeit practice). The
   clock is the process's CPU time (``time.process_time``), so time spent
   descheduled on a shared machine does not count for either side. Only
   ``update`` calls are timed, never input conversion.

``--set KEY=JSON`` (repeatable) changes a setting of ``default`` (in both
halves; the other modes keep theirs), to try an alternative on the whole grid.

Prints the tables and writes ``bench/results/tracker.json`` (every run of every
cell, every ratio) and ``tracker.png``. Exit status 0 when the default's worst
ratio is >= 1 and the speed targets hold. Needs the bench-only packages
``trackers`` and ``supervision`` (and their imports: opencv-python-headless,
pillow, pyyaml, tqdm, defusedxml, rich, requests, pydeprecate).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _devset as dev  # noqa: E402
from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from framerelay.commands.eval_tracker import load_detections  # noqa: E402
from framerelay.detections import Detections  # noqa: E402
from framerelay.errors import ConfigError  # noqa: E402
from tracker import available_trackers, create_tracker  # noqa: E402
from tracker import eval as ev  # noqa: E402

OURS = ("default", *(n for n in available_trackers() if n not in ("default", "none")))
METRICS = ("mota", "idf1", "hota")
SPEED_TARGETS = {20: 0.33, 100: 0.2}
"""Issue 16: ours <= this x roboflow ByteTrack's CPU time per update, by detections."""


@dataclass(frozen=True, slots=True)
class Row:
    sequence: str
    sampling: str
    frames: int
    tracker: str
    mota: float
    idf1: float
    hota: float
    deta: float
    assa: float
    loca: float
    id_switches: int
    distractor_matches: int
    us_per_update: float


# ------------------------------------------------------------------ accuracy


def accuracy(
    model: Path, seqs: Sequence[dev.DevSequence], bar: Progress, overrides: dict[str, Any]
) -> list[Row]:
    rows: list[Row] = []
    for seq in seqs:
        found = load_detections(seq.video, model, cache_dir=ROOT / ".cache" / "detections")
        frames = ev.retime(found, seq.fps)  # time from the source frame number
        gt = ev.load_gt(seq.gt)
        bar.advance()
        for sampling in dev.SAMPLINGS:
            kept = dev.sample(frames, sampling, seq.name)
            rate = dev.sampled_rate(seq.fps, len(frames), len(kept))
            rows += _cell(seq, sampling, kept, gt, rate, overrides)
            bar.advance()
    return rows


def _cell(seq: dev.DevSequence, sampling: dev.Sampling, kept: Sequence[ev.Frame],
          gt: ev.GroundTruth, rate: float, overrides: dict[str, Any]) -> list[Row]:  # fmt: skip
    kept = ev.select_frames(kept, 1)  # person class only
    rows: list[Row] = []
    for name in OURS:
        trk = create_tracker(name, **(overrides if name == "default" else {}))
        outs, secs = ev.run_tracker(trk, kept)
        rows.append(_row(seq.name, sampling.label, len(kept), name, ev.score(outs, gt), secs))
    for name in dev.THEIRS:
        for mode in dev.MODES:
            outs, secs = dev.run_theirs(name, kept, mode, rate)
            label = dev.label(name, mode)
            rows.append(_row(seq.name, sampling.label, len(kept), label, ev.score(outs, gt), secs))
    return rows


def _row(seq: str, sampling: str, frames: int, name: str, m: dict[str, float],
         secs: list[float]) -> Row:  # fmt: skip
    us = 1e6 * float(np.mean(secs)) if secs else 0.0
    return Row(seq, sampling, frames, name, m["mota"], m["idf1"], m["hota"], m["deta"],
               m["assa"], m["loca"], int(m["num_switches"]), int(m["distractor_matches"]),
               us)  # fmt: skip


def _ratio(ours: float, best: float) -> float | None:
    """ours / best; None when the best is not positive (a ratio would mislead)."""
    return ours / best if best > 0 else None


def verdicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Every mode of ours against the best roboflow run, per cell and metric."""
    out: list[dict[str, Any]] = []
    cells = dict.fromkeys((r.sequence, r.sampling) for r in rows)
    for seq, sampling in cells:
        cell = [r for r in rows if (r.sequence, r.sampling) == (seq, sampling)]
        theirs = [r for r in cell if r.tracker.startswith("rf.")]
        best = {m: max(theirs, key=attrgetter(m)) for m in METRICS}
        for ours in (r for r in cell if not r.tracker.startswith("rf.")):
            v: dict[str, Any] = {"sequence": seq, "sampling": sampling, "tracker": ours.tracker}
            for m in METRICS:
                theirs_m = getattr(best[m], m)
                v[f"ours_{m}"], v[f"best_{m}"], v[f"best_{m}_by"] = (
                    getattr(ours, m),
                    theirs_m,
                    best[m].tracker,
                )
                v[f"ratio_{m}"] = _ratio(getattr(ours, m), theirs_m)
            v["pass"] = all(v[f"ours_{m}"] >= v[f"best_{m}"] for m in METRICS)
            out.append(v)
    return out


def summary(verdict: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the worst ratio over every cell and metric, and where it is."""
    out: list[dict[str, Any]] = []
    for name in OURS:
        worst: tuple[float, str] = (float("inf"), "")
        ratios: list[float] = []
        for v in (v for v in verdict if v["tracker"] == name):
            for m in METRICS:
                if (r := v[f"ratio_{m}"]) is not None:
                    ratios.append(r)
                    worst = min(worst, (r, f"{v['sequence']} {v['sampling']} {m.upper()}"))
        cells = [v for v in verdict if v["tracker"] == name]
        out.append(
            {
                "tracker": name,
                "min_ratio": worst[0] if ratios else None,
                "worst": worst[1],
                "mean_ratio": float(np.mean(ratios)) if ratios else None,
                "cells_lost": sum(not v["pass"] for v in cells),
                "cells": len(cells),
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


def _time_ours(dets: Sequence[Detections], fps: float, overrides: dict[str, Any]) -> float:
    trk = create_tracker("default", **overrides)
    start = time.process_time()
    for k, d in enumerate(dets):
        trk.update(d, k / fps)
    return (time.process_time() - start) / len(dets)


def _time_theirs(dets: Sequence[Detections], fps: float) -> float:
    import supervision as sv

    inputs = [
        sv.Detections(xyxy=d.xyxy, confidence=d.confidence, class_id=d.class_id) for d in dets
    ]
    import trackers

    trk = trackers.ByteTrackTracker(frame_rate=fps)
    start = time.process_time()
    for k, d in enumerate(inputs):
        trk.update(d, timestamp=k / fps)
    return (time.process_time() - start) / len(inputs)


def speed(
    repeats: int,
    bar: Progress,
    overrides: dict[str, Any],
    frames: int = 1000,
    fps: float = 25.0,
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for n in SPEED_TARGETS:
        dets = synthetic(n, frames, fps=fps)
        timers: dict[str, Callable[[Sequence[Detections], float], float]] = {
            "ours": partial(_time_ours, overrides=overrides),
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
                "target": SPEED_TARGETS[n],
                "pass": ratio <= SPEED_TARGETS[n],
            }
        )
        bar.advance()
    return results


# ------------------------------------------------------------------ report


def _fmt(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.3f}"


def _print_rows(rows: Sequence[Row]) -> None:
    head = ("sequence", "sampling", "tracker", "MOTA", "IDF1", "HOTA", "DetA", "AssA", "IDsw",
            "distr", "us/upd")  # fmt: skip
    print("{:15} {:9} {:22} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>8}".format(*head))
    for r in rows:
        print(f"{r.sequence:15} {r.sampling:9} {r.tracker:22} {r.mota:6.3f} {r.idf1:6.3f} "
              f"{r.hota:6.3f} {r.deta:6.3f} {r.assa:6.3f} {r.id_switches:5d} "
              f"{r.distractor_matches:5d} {r.us_per_update:8.1f}")  # fmt: skip


def _print_ratios(verdict: Sequence[dict[str, Any]]) -> None:
    print("\nours / best roboflow run, per metric (MOTA IDF1 HOTA); * = below 1")
    print(f"{'sequence':15} {'sampling':9} " + " ".join(f"{n:>23}" for n in OURS))
    cells = dict.fromkeys((v["sequence"], v["sampling"]) for v in verdict)
    for seq, sampling in cells:
        parts = []
        for name in OURS:
            v = next(v for v in verdict if (v["sequence"], v["sampling"], v["tracker"]) ==
                     (seq, sampling, name))  # fmt: skip
            mark = " " if v["pass"] else "*"
            parts.append(mark + "".join(_fmt(v[f"ratio_{m}"]) + " " for m in METRICS)[:-1] + " ")
        print(f"{seq:15} {sampling:9} " + " ".join(f"{p:>23}" for p in parts))


def _print_default(verdict: Sequence[dict[str, Any]]) -> None:
    print("\nours (default) vs the best roboflow run")
    for v in (v for v in verdict if v["tracker"] == "default"):
        text = "; ".join(
            f"{m.upper()} {v[f'ours_{m}']:.3f} vs {v[f'best_{m}']:.3f} ({v[f'best_{m}_by']})"
            for m in METRICS
        )
        print(f"{v['sequence']:15} {v['sampling']:9} {text} -> {'PASS' if v['pass'] else 'FAIL'}")


def _print_summary(summ: Sequence[dict[str, Any]]) -> None:
    print("\nworst ratio over every cell and metric, per mode (issue 16 picks the default by it)")
    for s in summ:
        lost = f"cells lost {s['cells_lost']}/{s['cells']}"
        print(f"{s['tracker']:10} min {_fmt(s['min_ratio'])} at {s['worst']:32} "
              f"mean {_fmt(s['mean_ratio'])}  {lost}")  # fmt: skip


def _print_speed(sp: Sequence[dict[str, Any]]) -> None:
    print("\nspeed, synthetic detections (best of repeats)")
    for s in sp:
        print(
            f"{s['detections']:4d} dets x {s['frames']} frames: "
            f"ours {s['ours_us']:8.1f} us/update, "
            f"their ByteTrack {s['theirs_bytetrack_us']:8.1f} us/update, ratio {s['ratio']:.3f} "
            f"(target <= {s['target']:.3f}) -> {'PASS' if s['pass'] else 'FAIL'}"
        )


NEEDS = ("trackers", "supervision")
INSTALL = ".venv/bin/pip install --no-deps trackers==2.6.1 supervision (see bench/README.md)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, default=ROOT / "samples/models/yolox_nano_416.onnx")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data",
                   help="sequences: <name>/<name>.mp4, gt/gt.txt, seqinfo.ini")  # fmt: skip
    p.add_argument("--sequence", action="append", default=[], help="only these (repeatable)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of the speed half (1-50)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/tracker.json",
                   help="the JSON (the PNG goes beside it)")  # fmt: skip
    p.add_argument("--only", choices=("accuracy", "speed"), help="run one half (for quick checks)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="a setting of `default` to try, e.g. low_noise=2 (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    args.overrides = _overrides(p, args.set)
    if missing := [m for m in NEEDS if importlib.util.find_spec(m) is None]:
        p.error(f"needs {' and '.join(missing)}: {INSTALL}")
    if not 1 <= args.repeats <= 50:
        p.error("--repeats must be 1-50")
    if args.out.suffix != ".json":
        p.error(f"--out must end in .json: {args.out}")
    args.seqs = []
    if args.only != "speed":
        if not args.model.is_file():
            p.error(f"no model {args.model}")
        args.seqs = [s for s in dev.find_sequences(args.data)
                     if not args.sequence or s.name in args.sequence]  # fmt: skip
        if not args.seqs:
            p.error(f"no sequences (<name>.mp4 + gt/gt.txt + seqinfo.ini) in {args.data}")
    return args


def _overrides(p: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=JSON`` items as settings, checked by building a tracker."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set wants KEY=JSON, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            p.error(f"--set {key}: {value!r} is not JSON (strings need quotes)")
    try:
        create_tracker("default", **out)
    except ConfigError as exc:
        p.error(str(exc))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seqs: list[dev.DevSequence] = args.seqs
    steps = len(seqs) * (1 + len(dev.SAMPLINGS)) + (2 if args.only != "accuracy" else 0)
    with Progress(steps, "tracker", "steps") as bar:
        rows = accuracy(args.model, seqs, bar, args.overrides) if seqs else []
        verdict = verdicts(rows)
        summ = summary(verdict) if rows else []
        sp = speed(args.repeats, bar, args.overrides) if args.only != "accuracy" else []
    if rows:
        _print_rows(rows)
        _print_ratios(verdict)
        _print_default(verdict)
        _print_summary(summ)
    if sp:
        _print_speed(sp)
    import trackers

    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "roboflow_trackers": getattr(trackers, "__version__", "2.6.1"),
        "sequences": [{"name": s.name, "fps": s.fps, "gt": str(s.gt)} for s in seqs],
        "samplings": [asdict(s) for s in dev.SAMPLINGS],
        "default_overrides": args.overrides,
        "accuracy": [asdict(r) for r in rows],
        "verdict": verdict,
        "summary": summ,
        "speed": sp,
    }
    print()
    write_results(args.out.stem, result, plot, folder=args.out.parent)
    ok = all(v["pass"] for v in verdict if v["tracker"] == "default")
    return 0 if ok and all(s["pass"] for s in sp) else 1


def plot(fig: Figure, result: dict[str, Any]) -> None:
    """The default's ratio to the best roboflow run per cell and metric; speed."""
    verdict = [v for v in result["verdict"] if v["tracker"] == "default"]
    sp = result["speed"]
    ratios = [2.2] * bool(verdict) + [1.0] * bool(sp)
    if not ratios:
        return
    panels = fig.subplots(1, len(ratios), squeeze=False, width_ratios=ratios)[0]
    if verdict:
        ax = panels[0]
        x = np.arange(len(verdict))
        for k, m in enumerate(METRICS):
            values = [v[f"ratio_{m}"] or 0.0 for v in verdict]
            ax.bar(x + (k - 1) * 0.27, values, 0.27, label=m.upper())
        ax.axhline(1.0, color="black", linewidth=0.8)
        shown = [v[f"ratio_{m}"] for v in verdict for m in METRICS if v[f"ratio_{m}"] is not None]
        if shown:
            ax.set_ylim(max(0.0, min(shown) - 0.1), max(shown) + 0.05)
        ax.set_xticks(x, [f"{v['sequence']}\n{v['sampling']}" for v in verdict],
                      rotation=90, fontsize="x-small")  # fmt: skip
        ax.set(ylabel="ours (default) / best roboflow", title="accuracy ratio per cell")
        ax.legend(loc="lower right", fontsize="small")
    if sp:
        ax = panels[-1]
        x = np.arange(len(sp))
        ax.bar(x - 0.2, [s["ours_us"] for s in sp], 0.4, label="ours (default)")
        ax.bar(x + 0.2, [s["theirs_bytetrack_us"] for s in sp], 0.4,
               label="roboflow ByteTrack")  # fmt: skip
        ax.set_xticks(list(x), [f"{s['detections']} detections" for s in sp])
        ax.set(ylabel="CPU us per update (best repeat)", title="speed")
        ax.legend()


if __name__ == "__main__":
    raise SystemExit(main())
