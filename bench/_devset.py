"""The tracker's development set and roboflow's trackers, for ``bench/tracker.py``.

The development set is every sequence under ``--data`` (by default
``../shared/data``: TUD-Campus, TUD-Stadtmitte, KITTI-17, MOT16-09), each one a
folder with ``<name>.mp4``, ``gt/gt.txt`` (either MOTChallenge layout) and
``seqinfo.ini`` (its ``frameRate``), at every sampling in :data:`SAMPLINGS`.

Time: every frame's time is its source frame number over the sequence's frame rate
(:func:`tracker.eval.retime`), so sampled and dropped frames keep their real
times. Our trackers take that time. Roboflow's take it too (``timestamp=``), or run
in their fixed-frame-rate mode; either way they are built with the stream's real
frame rate, i.e. the sampled rate (source rate / K, or the mean rate left after
drops), which is what their ``frame_rate`` argument means.
"""

from __future__ import annotations

import configparser
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracker import eval as ev

THEIRS = ("ByteTrackTracker", "OCSORTTracker", "SORTTracker")
MODES = ("pts", "frames")
"""Roboflow's trackers given timestamps, and in their fixed-frame-rate mode."""
DROP_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Sampling:
    label: str
    every: int = 1
    drop: float = 0.0


SAMPLINGS = (
    Sampling("every 1"),
    Sampling("every 2", every=2),
    Sampling("every 5", every=5),
    Sampling("drop 20%", drop=DROP_SHARE),
)


@dataclass(frozen=True, slots=True)
class DevSequence:
    name: str
    video: Path
    gt: Path
    fps: float


def find_sequences(data: Path) -> list[DevSequence]:
    """Every folder under ``data`` with a video, ``gt/gt.txt`` and ``seqinfo.ini``."""
    out: list[DevSequence] = []
    for info in sorted(data.rglob("seqinfo.ini")):
        folder = info.parent
        video, gt = folder / f"{folder.name}.mp4", folder / "gt" / "gt.txt"
        if video.is_file() and gt.is_file():
            out.append(DevSequence(folder.name, video, gt, _frame_rate(info)))
    return sorted(out, key=lambda s: (s.name.startswith("MOT"), s.name))


def _frame_rate(info: Path) -> float:
    parser = configparser.ConfigParser()
    parser.read(info, encoding="utf-8")
    return float(parser["Sequence"]["frameRate"])


def sample(frames: Sequence[ev.Frame], s: Sampling, seed_name: str) -> list[ev.Frame]:
    """Frames a stream sampled as ``s`` would carry (drops seeded by the sequence)."""
    kept = ev.select_frames(frames, s.every)
    if s.drop:
        kept = ev.drop_frames(kept, s.drop, seed=zlib.crc32(seed_name.encode()))
    return kept


def sampled_rate(fps: float, all_frames: int, kept: int) -> float:
    """The stream's real mean frame rate after sampling."""
    return fps * kept / max(1, all_frames)


# ------------------------------------------------------------------ roboflow


def label(name: str, mode: str) -> str:
    return f"rf.{name.removesuffix('Tracker')}[{mode}]"


def run_theirs(
    name: str, frames: Sequence[ev.Frame], mode: str, rate: float
) -> tuple[list[ev.FrameOutput], list[float]]:
    """Roboflow's tracker ``name`` at frame rate ``rate``, with timestamps (``pts``) or not."""
    import supervision as sv
    import trackers

    trk: Any = getattr(trackers, name)(frame_rate=rate)
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
        out = trk.update(d, timestamp=f.t if mode == "pts" else None)
        seconds.append(time.perf_counter() - start)
        ids = np.asarray(out.tracker_id, np.int64)
        keep = ids >= 0
        outputs.append(ev.FrameOutput(f.index, ids[keep], out.xyxy[keep].astype(np.float32)))
    return outputs, seconds
