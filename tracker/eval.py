"""Score a tracker on detections of a real video against MOTChallenge ground truth.

The command line tool is ``framerelay eval-tracker`` (``framerelay.commands.eval_tracker``),
which runs the real detector: ``tracker`` imports no service, so the detector comes in
as a function (:data:`DetectFn`). Its output is cached under ``.cache/detections/`` per
(video, model, confidence), so that tuning runs only replay the tracker.
:func:`select_frames` with ``every=K`` keeps every K-th frame (frames 1, 1+K, ...),
emulating a sampler; the time given to the tracker is still the frame's real PTS, and
only the kept frames are scored.

motmetrics is imported inside the function that needs it, so ``import tracker.eval``
never needs it. motmetrics 1.4.0 calls ``np.asfarray``, which numpy 2 removed. Pinning
numpy < 2 is not an option (onnxruntime and the rest of the project use numpy 2), so
:func:`_motmetrics` adds the one missing function (``np.asarray`` with a float dtype,
which is exactly what ``asfarray`` did) before motmetrics is used, and only when numpy
lacks it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from framerelay.detections import Detections
from tracker.base import Tracker

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


DetectFn = Callable[[Path, Path, float], list[Frame]]
"""(video, model, confidence threshold) -> every frame's detections, all classes."""


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
    detect: DetectFn,
    *,
    confidence: float = 0.1,
    cache_dir: Path = DEFAULT_CACHE_DIR,
) -> list[Frame]:
    """Every frame's detections (all classes), from the cache or ``detect``."""
    path = cache_path(video, model, confidence, cache_dir)
    if path.is_file():
        return _load(path)
    frames = detect(video, model, confidence)
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
