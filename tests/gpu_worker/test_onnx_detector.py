"""The ONNX Runtime backend with the real YOLOX-Nano COCO model on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from framerelay.errors import ModelError
from framerelay.geometry import Letterbox
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from gpu_worker.detectors.onnx_backend import OnnxDetector, choose_providers
from tests.conftest import MODEL
from tests.support.detector_io import first_frames


@pytest.fixture(scope="module")
def detector() -> OnnxDetector:
    det = load_detector(settings_for_model(MODEL, confidence_threshold=0.3))
    assert isinstance(det, OnnxDetector)
    return det


def test_reports_providers_really_in_use(detector: OnnxDetector) -> None:
    assert detector.providers[-1] == "CPUExecutionProvider"
    assert set(detector.providers) <= set(choose_providers("auto"))
    assert detector.input_size == (416, 416)
    assert detector.format == "yolox"
    assert detector.class_names[0] == "person"


def test_finds_people_in_source_pixels(detector: OnnxDetector) -> None:
    det = detector.infer(first_frames(1))[0]
    people = det[det.class_id == 0]
    # Ground truth of frame 1 has 7 people; YOLOX-Nano finds most of them.
    assert len(people) >= 5
    assert people.xyxy[:, 2].max() <= 640 and people.xyxy[:, 3].max() <= 480
    gt_box = np.array([88, 99, 88 + 61.08, 99 + 218.56])
    ious = [_iou(gt_box, b) for b in people.xyxy]
    assert max(ious) > 0.5


def test_dynamic_batch_equals_one_by_one(detector: OnnxDetector) -> None:
    frames = first_frames(3)
    batched = detector.infer(frames)
    single = [detector.infer([f])[0] for f in frames]
    assert detector._batched  # the rewrite applied to the fixed-batch export
    for a, b in zip(batched, single, strict=True):
        assert a.equals(b, atol=1e-2)


def test_wrong_input_size_is_a_clear_error(detector: OnnxDetector) -> None:
    bad = ModelInput(np.zeros((100, 100, 3), np.uint8), Letterbox.fit(100, 100, 100, 100))
    with pytest.raises(ModelError, match="416x416x3"):
        detector.infer([bad])


def test_missing_and_broken_models(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        load_detector(settings_for_model(tmp_path / "nope.onnx"))
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="cannot load"):
        load_detector(settings_for_model(broken))


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return float(inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter))
