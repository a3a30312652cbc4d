"""In-graph pre-processing: the rewritten model fed uint8 NHWC BGR gives the original's output."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.typing import NDArray
from onnx import TensorProto, helper

from framerelay.errors import ModelError
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb
from gpu_worker.detectors import ModelInput
from gpu_worker.detectors.batch_axis import dynamic_batch_model
from gpu_worker.detectors.graph_prep import with_uint8_input
from gpu_worker.detectors.onnx_backend import OnnxDetector
from gpu_worker.images import decode_jpeg_bgr
from tests.support.detector_io import first_frames

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "samples" / "models" / "yolox_nano_416.onnx"
STILL = ROOT / "samples" / "mot15" / "TUD-Stadtmitte" / "frame-000001.jpg"
CPU = ["CPUExecutionProvider"]


def _inputs() -> list[ModelInput]:
    """The sample still letterboxed and JPEG-encoded as the canary does, decoded as the
    worker does, and the clip's first frames letterboxed as the ingest does."""
    lb = letterbox_jpeg(read_jpeg_rgb(STILL), 416, 416)
    return [ModelInput(decode_jpeg_bgr(lb.data, 416, 416), lb.letterbox), *first_frames(2)]


def _backend_tensor(batch: list[ModelInput], fmt: str) -> NDArray[np.float32]:
    """What ``OnnxDetector._to_tensor`` feeds the model today for this format."""
    me: Any = SimpleNamespace(input_size=(416, 416), format=fmt, _uint8=False)
    return OnnxDetector._to_tensor(me, batch)


def _run(model: bytes, feed: NDArray[Any]) -> NDArray[np.float32]:
    session = ort.InferenceSession(model, providers=CPU)
    out: Any = session.run(None, {session.get_inputs()[0].name: feed})[0]
    return np.asarray(out)


@pytest.fixture(scope="module")
def yolox() -> bytes:
    return MODEL.read_bytes()


@pytest.mark.parametrize("fmt", ["yolox", "ultralytics"])
def test_same_raw_output_as_the_float_tensor(yolox: bytes, fmt: str) -> None:
    # The pre-processing of either format is checked on the real YOLOX graph: the
    # rewrite only prepends nodes, so what matters is that the tensor it makes is
    # the backend's tensor.
    frames = _inputs()
    wrapped = with_uint8_input(yolox, fmt)  # type: ignore[arg-type]
    for frame in frames:  # the sample model's batch axis is fixed at 1
        want = _run(yolox, _backend_tensor([frame], fmt))
        got = _run(wrapped, frame.image[None])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_dynamic_batch_axis_is_kept(yolox: bytes) -> None:
    batched = dynamic_batch_model(yolox)
    assert batched is not None
    wrapped = with_uint8_input(batched, "yolox")
    session = ort.InferenceSession(wrapped, providers=CPU)
    inp = session.get_inputs()[0]
    assert (inp.name, inp.type) == ("images", "tensor(uint8)")
    assert not isinstance(inp.shape[0], int) and inp.shape[1:] == [416, 416, 3]
    frames = _inputs()
    images = np.stack([f.image for f in frames])
    want = _run(batched, _backend_tensor(frames, "yolox"))
    got = _run(wrapped, images)
    assert got.shape[0] == len(frames)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _identity_model(elem: int, batch: str | int) -> bytes:
    """A graph that returns its (N, 3, 4, 5) input: shows exactly what the prep made."""
    x = helper.make_tensor_value_info("x", elem, [batch, 3, 4, 5])
    y = helper.make_tensor_value_info("y", elem, [batch, 3, 4, 5])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.parametrize(
    ("elem", "dtype"), [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)]
)
@pytest.mark.parametrize("fmt", ["yolox", "ultralytics"])
def test_casts_to_the_models_input_type(elem: int, dtype: type, fmt: str) -> None:
    images = np.random.default_rng(0).integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
    got = _run(with_uint8_input(_identity_model(elem, "n"), fmt), images)  # type: ignore[arg-type]
    want: NDArray[Any] = images.transpose(0, 3, 1, 2).astype(dtype)
    if fmt == "ultralytics":
        want = want[:, ::-1] * dtype(1 / 255)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def _bad_input_model(shape: list[Any], elem: int = TensorProto.FLOAT) -> bytes:
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", [x], [y])
    return bytes(helper.make_model(graph).SerializeToString())


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (b"not a model", "not an ONNX model"),
        (_bad_input_model([1, 416, 416, 3]), "expected NCHW with 3 channels"),
        (_bad_input_model([1, 3, 8]), "expected NCHW with 3 channels"),
        (_bad_input_model([1, 3, 8, 8], TensorProto.UINT8), "expected FLOAT or FLOAT16"),
    ],
)
def test_refuses_what_it_cannot_rewrite(model: bytes, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        with_uint8_input(model, "yolox")


def test_unknown_format_is_refused(yolox: bytes) -> None:
    with pytest.raises(ModelError, match="knows 'yolox' and 'ultralytics'"):
        with_uint8_input(yolox, "detr")  # type: ignore[arg-type]


def test_output_is_a_valid_model(yolox: bytes) -> None:
    proto = onnx.load_from_string(with_uint8_input(yolox, "ultralytics"))
    onnx.checker.check_model(proto, full_check=True)
    assert [n.op_type for n in proto.graph.node[:4]] == ["Cast", "Transpose", "Gather", "Mul"]
