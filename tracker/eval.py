"""Score a tracker on a real video with MOTChallenge ground truth.

::

    python -m tracker.eval --model samples/models/yolox_nano_416.onnx \\
        --video samples/mot15/TUD-Campus/TUD-Campus.mp4 \\
        --gt samples/mot15/TUD-Campus/gt/gt.txt [--tracker NAME] [--every K] [--json]

The real detector runs once per (video, model, detector settings); its output is
cached under ``.cache/detections/`` so that tuning runs only replay the tracker.
``--every K`` keeps every K-th frame (frames 1, 1+K, ...), emulating a sampler;
the time given to the tracker is still the frame's real PTS, and only the kept
frames are scored.

Heavy imports (PyAV, onnxruntime, the detector, motmetrics) happen inside the
functions that need them, so ``import tracker`` never needs them.

motmetrics 1.4.0 calls ``np.asfarray``, which numpy 2 removed. Pinning numpy < 2
is not an option (onnxruntime and the rest of the project use numpy 2), so
:func:`_motmetrics` adds the one missing function (``np.asarray`` with a float
dtype, which is exactly what ``asfarray`` did) before motmetrics is used, and
only when numpy lacks it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from framerelay.detections import Detections
from tracker.base import Tracker, create_tracker

CACHE_VERSION = 1
DEFAULT_CACHE_DIR = Path(".cache") / "detections"
PERSON = 0
"""COCO class index of 'person' (the MOT15 ground truth labels pedestrians)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame's detections: ``index`` is 1-based (MOT frame number)."""

    index: int
    t: float
    detections: Detections


@dataclass(frozen=True, slots=True)
class FrameOutput:
    """What a tracker reported for one frame: boxes with their confirmed ids."""

    index: int
    ids: NDArray[np.int64]
    xyxy: NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class EvalResult:
    """Scores of one tracker run (MOTChallenge CLEAR and identity metrics)."""

    tracker: str
    every: int
    frames: int
    mota: float
    idf1: float
    id_switches: int
    precision: float
    recall: float
    false_positives: int
    misses: int
    frames_per_s: float
    us_per_update: float
    us_per_update_median: float


# --------------------------------------------------------------------- detections


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_path(video: Path, model: Path, confidence: float, cache_dir: Path) -> Path:
    """Where the detections of ``video`` by ``model`` at ``confidence`` are cached."""
    key = f"v{CACHE_VERSION}|{_file_digest(video)}|{_file_digest(model)}|{confidence:.6f}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return cache_dir / f"{video.stem}-{digest}.npz"


def _run_detector(video: Path, model: Path, confidence: float) -> list[Frame]:
    import av

    from framerelay.geometry import PAD_VALUE, Letterbox
    from gpu_worker.detectors import ModelInput, load_detector, settings_for_model

    det = load_detector(settings_for_model(model, confidence_threshold=confidence, max_batch=1))
    width, height = det.input_size
    frames: list[Frame] = []
    with av.open(str(video)) as container:
        for n, frame in enumerate(container.decode(video=0), start=1):
            lb = Letterbox.fit(frame.width, frame.height, width, height)
            small = frame.reformat(lb.new_w, lb.new_h, format="bgr24").to_ndarray()
            canvas = np.full((height, width, 3), PAD_VALUE, np.uint8)
            canvas[: lb.new_h, : lb.new_w] = small
            d = det.infer([ModelInput(canvas, lb)])[0]
            t = float(frame.time) if frame.time is not None else (n - 1) / 25.0
            frames.append(Frame(n, t, d))
    return frames


def _save(frames: Sequence[Frame], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = np.array([len(f.detections) for f in frames], np.int64)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        np.savez(
            fh,
            index=np.array([f.index for f in frames], np.int64),
            t=np.array([f.t for f in frames], np.float64),
            counts=counts,
            xyxy=np.concatenate([f.detections.xyxy for f in frames]).reshape(-1, 4),
            confidence=np.concatenate([f.detections.confidence for f in frames]),
            class_id=np.concatenate([f.detections.class_id for f in frames]),
        )
    tmp.replace(path)  # atomic: concurrent runs never see half a file


def _load(path: Path) -> list[Frame]:
    with np.load(path) as z:
        bounds = np.concatenate([[0], np.cumsum(z["counts"])])
        xyxy, conf, cls = z["xyxy"], z["confidence"], z["class_id"]
        return [
            Frame(int(i), float(t), Detections(xyxy[a:b], conf[a:b], cls[a:b]))
            for i, t, a, b in zip(z["index"], z["t"], bounds[:-1], bounds[1:], strict=True)
        ]


def load_detections(
    video: Path,
    model: Path,
    *,
    confidence: float = 0.1,
    cache_dir: Path = DEFAULT_CACHE_DIR,
) -> list[Frame]:
    """Every frame's detections (all classes), from the cache or the real detector."""
    path = cache_path(video, model, confidence, cache_dir)
    if path.is_file():
        return _load(path)
    frames = _run_detector(video, model, confidence)
    _save(frames, path)
    return frames


def select_frames(
    frames: Sequence[Frame], every: int = 1, class_id: int | None = PERSON
) -> list[Frame]:
    """Keep every ``every``-th frame (first one included) and one class (None: all)."""
    if every < 1:
        raise ValueError(f"--every must be >= 1, got {every}")
    kept = list(frames[::every])
    if class_id is None:
        return kept
    return [Frame(f.index, f.t, f.detections[f.detections.class_id == class_id]) for f in kept]


# --------------------------------------------------------------------- tracking


def run_tracker(trk: Tracker, frames: Sequence[Frame]) -> tuple[list[FrameOutput], list[float]]:
    """Feed ``frames`` to ``trk``; confirmed outputs per frame, seconds per update."""
    outputs: list[FrameOutput] = []
    seconds: list[float] = []
    clock = time.perf_counter
    for f in frames:
        start = clock()
        out = trk.update(f.detections, f.t)
        seconds.append(clock() - start)
        keep = out.tracker_id >= 0
        outputs.append(FrameOutput(f.index, out.tracker_id[keep], out.xyxy[keep]))
    return outputs, seconds


# --------------------------------------------------------------------- scoring


def load_gt(path: Path) -> dict[int, tuple[NDArray[np.int64], NDArray[np.float32]]]:
    """MOTChallenge ``gt.txt``: frame -> (ids, xyxy); rows with conf 0 are ignored."""
    rows = np.loadtxt(path, delimiter=",", ndmin=2)
    rows = rows[rows[:, 6] != 0]
    out: dict[int, tuple[NDArray[np.int64], NDArray[np.float32]]] = {}
    for frame in np.unique(rows[:, 0]).astype(int):
        r = rows[rows[:, 0] == frame]
        xyxy = np.column_stack([r[:, 2], r[:, 3], r[:, 2] + r[:, 4], r[:, 3] + r[:, 5]])
        out[int(frame)] = (r[:, 1].astype(np.int64), xyxy.astype(np.float32))
    return out


def _motmetrics() -> ModuleType:
    if not hasattr(np, "asfarray"):  # numpy 2 removed it; motmetrics 1.4.0 still calls it

        def asfarray(a: Any, dtype: Any = np.float64) -> NDArray[Any]:
            return np.asarray(a, dtype=dtype)

        np.asfarray = asfarray  # type: ignore[attr-defined]
    return importlib.import_module("motmetrics")


def _xywh(xyxy: NDArray[np.float32]) -> NDArray[np.float64]:
    b = xyxy.astype(np.float64)
    return np.column_stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]])


def score(
    outputs: Sequence[FrameOutput],
    gt: dict[int, tuple[NDArray[np.int64], NDArray[np.float32]]],
) -> dict[str, float]:
    """MOTA, IDF1, ID switches, precision, recall on the frames in ``outputs``.

    Matching uses IoU >= 0.5, the MOTChallenge convention.
    """
    mm = _motmetrics()
    acc = mm.MOTAccumulator(auto_id=False)
    empty_ids = np.empty(0, np.int64)
    empty_boxes = np.empty((0, 4), np.float32)
    for out in outputs:
        gt_ids, gt_boxes = gt.get(out.index, (empty_ids, empty_boxes))
        dist = mm.distances.iou_matrix(_xywh(gt_boxes), _xywh(out.xyxy), max_iou=0.5)
        acc.update(gt_ids.tolist(), out.ids.tolist(), dist, frameid=out.index)
    names = ["mota", "idf1", "num_switches", "precision", "recall", "num_false_positives"]
    summary = mm.metrics.create().compute(acc, metrics=[*names, "num_misses"], name="run")
    row = summary.iloc[0]
    return {k: float(row[k]) for k in [*names, "num_misses"]}


def evaluate_frames(
    trk: Tracker, frames: Sequence[Frame], gt_path: Path, *, every: int, name: str
) -> EvalResult:
    """Run ``trk`` over already selected ``frames`` and score it."""
    outputs, seconds = run_tracker(trk, frames)
    m = score(outputs, load_gt(gt_path))
    total = float(sum(seconds))
    return EvalResult(
        tracker=name,
        every=every,
        frames=len(frames),
        mota=m["mota"],
        idf1=m["idf1"],
        id_switches=int(m["num_switches"]),
        precision=m["precision"],
        recall=m["recall"],
        false_positives=int(m["num_false_positives"]),
        misses=int(m["num_misses"]),
        frames_per_s=len(frames) / total if total > 0 else float("inf"),
        us_per_update=1e6 * total / max(1, len(frames)),
        us_per_update_median=1e6 * float(np.median(seconds)) if seconds else 0.0,
    )


# --------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tracker.eval", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="detector model (.onnx)")
    p.add_argument("--video", type=Path, required=True, help="video file")
    p.add_argument("--gt", type=Path, required=True, help="MOTChallenge gt.txt")
    p.add_argument("--tracker", default="default", help="registered tracker name")
    p.add_argument("--every", type=int, default=1, help="keep every K-th frame")
    p.add_argument("--confidence", type=float, default=0.1, help="detector threshold")
    p.add_argument(
        "--class-id", type=int, default=PERSON, help="class to track (-1: all); 0 = person"
    )
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=JSON", help="tracker setting override"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set wants KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for path in (args.model, args.video, args.gt):
        if not path.is_file():
            print(f"error: file not found: {path}", file=sys.stderr)
            return 2
    frames = load_detections(
        args.video, args.model, confidence=args.confidence, cache_dir=args.cache_dir
    )
    cls = None if args.class_id < 0 else args.class_id
    kept = select_frames(frames, args.every, cls)
    trk = create_tracker(args.tracker, **_overrides(args.set))
    result = evaluate_frames(trk, kept, args.gt, every=args.every, name=args.tracker)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        for key, value in asdict(result).items():
            text = f"{value:.4f}" if isinstance(value, float) else str(value)
            print(f"{key:>16}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
