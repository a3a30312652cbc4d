"""``framerelay eval-tracker``: score a tracker on a real video with MOTChallenge ground truth.

::

    framerelay eval-tracker --model samples/models/yolox_nano_416.onnx \\
        --video samples/mot15/TUD-Campus/TUD-Campus.mp4 \\
        --gt samples/mot15/TUD-Campus/gt/gt.txt [--tracker NAME] [--every K] [--json]

The scoring lives in :mod:`tracker.eval`, which imports no service; this command is
the composition root that runs the real detector (``gpu_worker.detectors``, letterboxed
like the worker) over the video with PyAV (:func:`detect_video`) and hands the result
to it. PyAV, onnxruntime and the detector are imported inside the functions that use
them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framerelay.commands._types import finite_float
from framerelay.errors import ConfigError

if TYPE_CHECKING:
    from tracker.eval import Frame

HELP = "score a tracker on a video with MOTChallenge ground truth (MOTA, IDF1, ...)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval-tracker", help=HELP, description=HELP + ".")
    p.add_argument("--model", type=Path, required=True, help="detector model (.onnx)")
    p.add_argument("--video", type=Path, required=True, help="video file")
    p.add_argument("--gt", type=Path, required=True, help="MOTChallenge gt.txt")
    p.add_argument("--tracker", default="default", help="registered tracker name")
    p.add_argument("--every", type=int, default=1, help="keep every K-th frame")
    p.add_argument("--confidence", type=finite_float, default=0.1, help="detector threshold")
    p.add_argument(
        "--class-id", type=int, default=0, help="class to track (-1: all); 0 = person (COCO)"
    )
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="detections cache (.cache/detections)"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=JSON", help="tracker setting override"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def detect_video(video: Path, model: Path, confidence: float) -> list[Frame]:
    """Every frame's detections (all classes) by the real detector, letterboxed like the worker."""
    import av
    import numpy as np

    from framerelay.geometry import PAD_VALUE, Letterbox
    from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
    from tracker.eval import Frame

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


def load_detections(
    video: Path, model: Path, *, confidence: float = 0.1, cache_dir: Path | None = None
) -> list[Frame]:
    """:func:`tracker.eval.load_detections` with the real detector (cached)."""
    from tracker import eval as ev

    directory = ev.DEFAULT_CACHE_DIR if cache_dir is None else cache_dir
    return ev.load_detections(
        video, model, detect_video, confidence=confidence, cache_dir=directory
    )


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set wants KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    from tracker import create_tracker
    from tracker import eval as ev

    for path in (args.model, args.video, args.gt):
        if not path.is_file():
            raise ConfigError(f"file not found: {path}")
    frames = load_detections(
        args.video, args.model, confidence=args.confidence, cache_dir=args.cache_dir
    )
    cls = None if args.class_id < 0 else args.class_id
    kept = ev.select_frames(frames, args.every, cls)
    trk = create_tracker(args.tracker, **_overrides(args.set))
    result = ev.evaluate_frames(trk, kept, args.gt, every=args.every, name=args.tracker)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        for key, value in asdict(result).items():
            text = f"{value:.4f}" if isinstance(value, float) else str(value)
            print(f"{key:>16}: {text}")
    return 0
