"""Detector inputs and outputs for the detector tests: the first frames of the sample clip
letterboxed to 416 x 416 as the worker feeds them, and a check that two runs' detections
are the same."""

from __future__ import annotations

import av
import numpy as np

from framerelay.detections import Detections
from framerelay.geometry import PAD_VALUE, Letterbox
from gpu_worker.detectors import ModelInput
from tests.conftest import CLIP


def first_frames(n: int) -> list[ModelInput]:
    out = []
    with av.open(str(CLIP)) as c:
        for i, frame in enumerate(c.decode(video=0)):
            if i >= n:
                break
            lb = Letterbox.fit(frame.width, frame.height, 416, 416)
            canvas = np.full((416, 416, 3), PAD_VALUE, np.uint8)
            canvas[: lb.new_h, : lb.new_w] = frame.reformat(
                lb.new_w, lb.new_h, format="bgr24"
            ).to_ndarray()
            out.append(ModelInput(canvas, lb))
    return out


def same_detections(a: list[Detections], b: list[Detections]) -> int:
    """Equal detections (boxes to 1e-3 px, scores to 1e-5); returns how many."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        np.testing.assert_allclose(x.xyxy, y.xyxy, atol=1e-3)
        np.testing.assert_allclose(x.confidence, y.confidence, atol=1e-5)
        assert (x.class_id == y.class_id).all()
        assert x.class_id.dtype == y.class_id.dtype
    return sum(len(x) for x in a)
