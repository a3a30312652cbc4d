"""Score a tracker on detections of a real video against MOTChallenge ground truth.

The command line tool is ``framerelay eval-tracker`` (``framerelay.commands.eval_tracker``),
which runs the real detector: ``tracker`` imports no service, so the detector comes in
as a function (:data:`DetectFn`). Its output is cached under ``.cache/detections/`` per
(video, model, confidence), so that tuning runs only replay the tracker.
:func:`select_frames` with ``every=K`` keeps every K-th frame (frames 1, 1+K, ...),
emulating a sampler, and :func:`drop_frames` drops a seeded random share of them, like
a lossy link; the time given to the tracker is still the frame's real time, and only
the kept frames are scored. :func:`retime` sets that time from the source frame number.

Ground truth in either MOTChallenge layout (MOT15, MOT16/MOT17) is read and
preprocessed by :mod:`tracker.mot_gt`; :func:`score` gives the CLEAR and identity
figures (MOTA, IDF1, ...; :mod:`tracker.clear`) and HOTA (:mod:`tracker.hota`) on the
same preprocessed frames, each as TrackEval (MOTChallenge's evaluator) defines it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from framerelay.detections import Detections
from tracker.base import Tracker
from tracker.clear import clear
from tracker.hota import hota
from tracker.mot_gt import (
    GroundTruth,
    GroundTruthError,
    Layout,
    ScoredFrame,
    load_gt,
    preprocess_frame,
)

__all__ = [
    "DEFAULT_CACHE_DIR",
    "PERSON",
    "DetectFn",
    "EvalResult",
    "Frame",
    "FrameOutput",
    "GroundTruth",
    "GroundTruthError",
    "Layout",
    "ScoredFrame",
    "cache_path",
    "drop_frames",
    "evaluate_frames",
    "load_detections",
    "load_gt",
    "preprocess",
    "retime",
    "run_tracker",
    "score",
    "select_frames",
]

CACHE_VERSION = 1
DEFAULT_CACHE_DIR = Path(".cache") / "detections"
PERSON = 0
"""COCO class index of 'person' (the MOT ground truth labels pedestrians)."""


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
    xyxy: NDArray[np.floating]


@dataclass(frozen=True, slots=True)
class EvalResult:
    """Scores of one tracker run (MOTChallenge CLEAR, identity and HOTA metrics)."""

    tracker: str
    every: int
    frames: int
    mota: float
    idf1: float
    hota: float
    deta: float
    assa: float
    loca: float
    id_switches: int
    precision: float
    recall: float
    false_positives: int
    misses: int
    distractor_matches: int
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


def drop_frames(frames: Sequence[Frame], share: float, seed: int) -> list[Frame]:
    """Drop each frame but the first with probability ``share`` (seeded), like a lossy link."""
    if not 0 <= share < 1:
        raise ValueError(f"share of dropped frames must be in [0, 1), got {share}")
    keep = np.random.default_rng(seed).random(len(frames)) >= share
    keep[:1] = True
    return [f for f, k in zip(frames, keep, strict=True) if k]


def retime(frames: Sequence[Frame], fps: float) -> list[Frame]:
    """The same frames timed from their source frame number: ``t = (index - 1) / fps``."""
    if not (np.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number, got {fps}")
    return [Frame(f.index, (f.index - 1) / fps, f.detections) for f in frames]


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


def preprocess(outputs: Sequence[FrameOutput], gt: GroundTruth) -> list[ScoredFrame]:
    """``outputs`` against ``gt`` after the benchmark's preprocessing (:mod:`tracker.mot_gt`)."""
    return [preprocess_frame(o.index, gt.frame(o.index), o.ids, o.xyxy) for o in outputs]


def score(outputs: Sequence[FrameOutput], gt: GroundTruth) -> dict[str, float]:
    """Every metric on the frames in ``outputs`` (gt of other frames is not scored).

    ``mota``, ``motp``, ``idf1``, ``num_switches``, ``precision``, ``recall``,
    ``num_false_positives``, ``num_misses`` (:mod:`tracker.clear`; the count keys keep
    motmetrics' names), ``hota``, ``deta``, ``assa``, ``loca`` (:mod:`tracker.hota`)
    and ``distractor_matches`` (tracker boxes removed because they matched a
    distractor; always 0 for MOT15).
    """
    frames = preprocess(outputs, gt)
    c = clear(frames)
    out = {
        "mota": c.mota,
        "motp": c.motp,
        "idf1": c.idf1,
        "num_switches": float(c.id_switches),
        "precision": c.precision,
        "recall": c.recall,
        "num_false_positives": float(c.false_positives),
        "num_misses": float(c.misses),
    }
    out.update(asdict(hota(frames)))
    out["distractor_matches"] = float(sum(f.removed for f in frames))
    return out


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
        hota=m["hota"],
        deta=m["deta"],
        assa=m["assa"],
        loca=m["loca"],
        id_switches=int(m["num_switches"]),
        precision=m["precision"],
        recall=m["recall"],
        false_positives=int(m["num_false_positives"]),
        misses=int(m["num_misses"]),
        distractor_matches=int(m["distractor_matches"]),
        frames_per_s=len(frames) / total if total > 0 else float("inf"),
        us_per_update=1e6 * total / max(1, len(frames)),
        us_per_update_median=1e6 * float(np.median(seconds)) if seconds else 0.0,
    )
