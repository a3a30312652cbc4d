"""The worker's detector with pre-processing in the graph (uint8 NHWC in, the cast and
transpose done by ONNX Runtime): the same detections as numpy's float tensor, through
the CPU provider (on a GPU the same graph runs on the device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from framerelay.detections import Detections
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from gpu_worker.detectors import ort_providers as op
from gpu_worker.detectors.onnx_backend import OnnxDetector
from tests.conftest import MODEL
from tests.support.detector_io import first_frames


def _detector(**overrides: Any) -> OnnxDetector:
    det = load_detector(settings_for_model(MODEL, confidence_threshold=0.3, **overrides))
    assert isinstance(det, OnnxDetector)
    return det


def _same(a: list[Detections], b: list[Detections]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y) > 0
        np.testing.assert_allclose(x.xyxy, y.xyxy, atol=1e-3)
        np.testing.assert_allclose(x.confidence, y.confidence, atol=1e-5)
        assert (x.class_id == y.class_id).all()


@pytest.fixture(scope="module")
def frames() -> list[ModelInput]:
    return first_frames(3)


@pytest.mark.parametrize("max_batch", [1, 8])
def test_in_graph_prep_gives_the_same_detections(frames: list[ModelInput], max_batch: int) -> None:
    plain = _detector(in_graph_prep="off", max_batch=max_batch)
    prep = _detector(in_graph_prep="on", max_batch=max_batch)
    assert prep.acceleration.in_graph_prep and not plain.acceleration.in_graph_prep
    assert prep.providers == (op.CPU,)
    _same(plain.infer(frames), prep.infer(frames))


def test_in_graph_prep_with_io_binding(frames: list[ModelInput]) -> None:
    plain = _detector(in_graph_prep="off")
    both = _detector(in_graph_prep="on", io_binding="on")
    assert both.acceleration.io_binding and both.acceleration.in_graph_prep
    _same(plain.infer(frames), both.infer(frames))


def test_auto_is_off_on_the_cpu_provider() -> None:
    assert not _detector().acceleration.in_graph_prep


def test_the_tensorrt_profile_follows_the_input_layout() -> None:
    nhwc = op.ModelShape("images", 3, 416, 416, True, channels_last=True)
    nchw = op.ModelShape("images", 3, 416, 416, True)
    assert nhwc.dims(8) == "8x416x416x3" and nchw.dims(8) == "8x3x416x416"
