"""In-graph post-processing (box decode, top-k, class-aware NMS in the ONNX graph): the
same detections as the numpy path (:mod:`gpu_worker.detectors.postprocess`), through the
CPU provider (on a GPU the same nodes run on the device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.typing import NDArray
from onnx import TensorProto, helper

from framerelay.detections import Detections
from framerelay.errors import ModelError
from framerelay.geometry import Letterbox
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from gpu_worker.detectors.graph_post import OUTPUTS, split_detections, with_nms
from gpu_worker.detectors.onnx_backend import OnnxDetector
from gpu_worker.detectors.postprocess import (
    PostprocessSettings,
    decode_ultralytics,
    decode_yolox,
    select,
    yolox_grid,
)
from tests.conftest import MODEL
from tests.support.detector_io import first_frames, same_detections

CPU = ["CPUExecutionProvider"]
ANCHORS, CLASSES = 3549, 80


def _detector(**overrides: Any) -> OnnxDetector:
    det = load_detector(settings_for_model(MODEL, **overrides))
    assert isinstance(det, OnnxDetector)
    return det


@pytest.fixture(scope="module")
def frames() -> list[ModelInput]:
    return first_frames(8)


@pytest.fixture(scope="module")
def raw_yolox(frames: list[ModelInput]) -> NDArray[np.float32]:
    """The sample model's raw output (8, 3549, 85) for the clip's first frames."""
    session = ort.InferenceSession(MODEL.read_bytes(), providers=CPU)
    feed = [np.ascontiguousarray(f.image.transpose(2, 0, 1)[None], np.float32) for f in frames]
    return np.concatenate([session.run(None, {"images": x})[0] for x in feed])


@pytest.mark.parametrize(("max_batch", "threshold"), [(1, 0.1), (8, 0.1), (8, 0.3)])
def test_the_detector_finds_the_same_as_numpy(
    frames: list[ModelInput], max_batch: int, threshold: float
) -> None:
    plain = _detector(in_graph_post="off", max_batch=max_batch, confidence_threshold=threshold)
    post = _detector(in_graph_post="on", max_batch=max_batch, confidence_threshold=threshold)
    assert post.acceleration.in_graph_post and not plain.acceleration.in_graph_post
    assert post.acceleration.as_info()["in_graph_post"] is True
    found = same_detections(plain.infer(frames), post.infer(frames))
    assert found > 8 * 3  # people in every frame of the clip


def test_with_prep_and_io_binding_too(frames: list[ModelInput]) -> None:
    plain = _detector(in_graph_post="off")
    every = _detector(in_graph_post="on", in_graph_prep="on", io_binding="on")
    assert every.acceleration.io_binding and every.acceleration.in_graph_prep
    same_detections(plain.infer(frames), every.infer(frames))


def test_auto_is_off_on_the_cpu_provider() -> None:
    assert not _detector().acceleration.in_graph_post


def test_an_image_with_nothing_in_a_batch_gets_empty_detections(
    frames: list[ModelInput],
) -> None:
    grey = ModelInput(np.full((416, 416, 3), 114, np.uint8), frames[0].letterbox)
    batch = [frames[0], grey, frames[1], grey]
    plain = _detector(in_graph_post="off").infer(batch)
    post = _detector(in_graph_post="on").infer(batch)
    same_detections(plain, post)
    assert len(post[1]) == len(post[3]) == 0 < len(post[0])


def _identity_model(shape: list[Any], opset: int) -> bytes:
    """A model whose output is its input: the raw tensor is fed directly."""
    x = helper.make_tensor_value_info("raw_in", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("raw", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["raw_in"], ["raw"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _graph_detections(model: bytes, raw: NDArray[np.float32], lbs: list[Letterbox]
                      ) -> list[Detections]:  # fmt: skip
    session = ort.InferenceSession(model, providers=CPU)
    assert [o.name for o in session.get_outputs()] == list(OUTPUTS)
    return split_detections(session.run(None, {"raw_in": raw}), lbs)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("top_k", [1000, 5])
def test_yolox_rows_top_k_and_opsets(
    raw_yolox: NDArray[np.float32], frames: list[ModelInput], opset: int, top_k: int
) -> None:
    settings = PostprocessSettings(0.1, 0.45, 300, top_k)
    lbs = [f.letterbox for f in frames]
    model = with_nms(_identity_model(["b", ANCHORS, 85], opset), "yolox", (416, 416), settings)
    grid = yolox_grid(416, 416)
    pairs = zip(raw_yolox, lbs, strict=True)
    numpy = [select(*decode_yolox(r, grid, 0.1), lb, settings) for r, lb in pairs]
    found = same_detections(numpy, _graph_detections(model, raw_yolox, lbs))
    assert found <= 5 * len(frames) if top_k == 5 else found > 5 * len(frames)


def test_ultralytics_rows(raw_yolox: NDArray[np.float32], frames: list[ModelInput]) -> None:
    """Ultralytics (B, 4 + C, A): pixel cx, cy, w, h and class scores, no objectness; made
    from the real YOLOX output so the boxes and scores are realistic."""
    grid = yolox_grid(416, 416)
    stride = grid[:, 2:]
    cxcy = (raw_yolox[..., :2] + grid[:, :2]) * stride
    wh = np.exp(np.minimum(raw_yolox[..., 2:4], 20.0)) * stride
    scores = raw_yolox[..., 4:5] * raw_yolox[..., 5:]
    rows = np.concatenate([cxcy, wh, scores], axis=2).transpose(0, 2, 1).astype(np.float32)
    settings = PostprocessSettings(0.2, 0.5, 100, 1000)
    lbs = [f.letterbox for f in frames]
    model = with_nms(_identity_model(["b", 4 + CLASSES, ANCHORS], 17), "ultralytics",
                     (416, 416), settings)  # fmt: skip
    numpy = [select(*decode_ultralytics(r), lb, settings) for r, lb in zip(rows, lbs, strict=True)]
    assert same_detections(numpy, _graph_detections(model, np.ascontiguousarray(rows), lbs)) > 8


def test_max_detections_caps_each_image(raw_yolox: NDArray[np.float32],
                                        frames: list[ModelInput]) -> None:  # fmt: skip
    settings = PostprocessSettings(0.01, 0.9, 3, 1000)
    model = with_nms(_identity_model(["b", ANCHORS, 85], 11), "yolox", (416, 416), settings)
    found = _graph_detections(model, raw_yolox, [f.letterbox for f in frames])
    assert [len(d) for d in found] == [3] * len(frames)


def test_split_orders_rows_by_image() -> None:
    lb = Letterbox.fit(416, 416, 416, 416)
    batch = np.array([2, 0, 2])
    boxes = np.array([[0, 0, 10, 10], [1, 1, 5, 5], [2, 2, 8, 8]], np.float32)
    got = split_detections([batch, boxes, np.array([0.9, 0.8, 0.7], np.float32),
                            np.array([1, 0, 3])], [lb, lb, lb])  # fmt: skip
    assert [len(d) for d in got] == [1, 0, 2]
    assert got[2].confidence.tolist() == pytest.approx([0.9, 0.7])
    assert got[2].class_id.tolist() == [1, 3]


def test_models_it_cannot_rewrite_say_why() -> None:
    with pytest.raises(ModelError, match="not an ONNX model"):
        with_nms(b"nonsense", "yolox", (416, 416), PostprocessSettings())
    with pytest.raises(ModelError, match="opset >= 11"):
        with_nms(_identity_model([1, ANCHORS, 85], 10), "yolox", (416, 416),
                 PostprocessSettings())  # fmt: skip
    with pytest.raises(ModelError, match="fixed number of anchors"):
        with_nms(_identity_model([1, "a", 85], 11), "yolox", (416, 416), PostprocessSettings())
    with pytest.raises(ModelError, match="knows 'yolox' and 'ultralytics'"):
        with_nms(_identity_model([1, ANCHORS, 85], 11), "ssd", (416, 416),  # type: ignore[arg-type]
                 PostprocessSettings())  # fmt: skip
    two = onnx.load_from_string(_identity_model([1, ANCHORS, 85], 11))
    two.graph.output.append(helper.make_tensor_value_info("raw_in", TensorProto.FLOAT, None))
    with pytest.raises(ModelError, match="one raw output"):
        with_nms(two.SerializeToString(), "yolox", (416, 416), PostprocessSettings())
