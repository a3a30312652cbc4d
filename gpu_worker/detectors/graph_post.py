"""Rewrite an ONNX detector so post-processing (box decode, top-k, NMS) runs in its graph.

Without it, the worker copies the whole raw output of a batch to the host
(``(B, 3549, 85)`` floats per 416 YOLOX image) and decodes and suppresses each
image in numpy (:mod:`~gpu_worker.detectors.postprocess`): tens of numpy calls
and a greedy loop per image, about as long as the inference itself on a GPU.
:func:`with_nms` appends the same steps as ONNX nodes, so they run on the
model's execution provider for the whole batch at once, and only the kept boxes
come back:

- decode: YOLOX ``(cx + grid) * stride``, ``exp(min(log w, 20)) * stride``,
  score = objectness x best class score; Ultralytics boxes are already pixels,
  score = best class score; boxes as corners (x1, y1, x2, y2);
- ``TopK`` of ``pre_nms_top_k`` scores per image;
- class-aware ``NonMaxSuppression`` in one pass (boxes offset by class x 4096,
  as the numpy path does), ``score > confidence_threshold``, ``IoU > nms_iou``
  suppressed, at most ``max_detections`` per image, by falling score;
- ``GatherND`` of the kept rows.

The graph then has four outputs, one row per kept detection of the whole batch
(:data:`OUTPUTS`): the image's index in the batch (int64), the box (float32
model-input pixels), the score and the class id (int64). The host only maps
boxes to source pixels (:func:`split_detections`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from framerelay.detections import Detections
from framerelay.errors import ModelError
from framerelay.geometry import Letterbox
from gpu_worker.detectors.graph_edit import Format, checked_bytes, open_model
from gpu_worker.detectors.postprocess import PostprocessSettings, yolox_grid

P = "framerelay_post_"
WHAT = "post-processing"
OUTPUTS = ("framerelay_det_batch", "framerelay_det_boxes", "framerelay_det_scores",
           "framerelay_det_class")  # fmt: skip
"""The rewritten model's outputs: image index, xyxy box, score, class id (one row each)."""
MIN_OPSET = 11  # TopK with `largest`, GatherND, NonMaxSuppression, ArgMax/ReduceMax axes attrs
CLASS_OFFSET = 4096.0  # as postprocess.select: one NMS pass is class-aware


class _Builder:
    """Nodes and constants appended to a graph; names get the :data:`P` prefix (``#name``:
    a name of the original graph, kept as it is)."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    @staticmethod
    def name(n: str) -> str:
        return n[1:] if n.startswith("#") else f"{P}{n}"

    def const(self, name: str, value: Any, dtype: type[np.generic] = np.int64) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), P + name))
        return name

    def op(self, op: str, inputs: Sequence[str], outputs: str | Sequence[str],
           **attrs: Any) -> None:  # fmt: skip
        outs = [outputs] if isinstance(outputs, str) else list(outputs)
        self.nodes.append(helper.make_node(
            op, [self.name(i) for i in inputs], [self.name(o) for o in outs],
            name=self.name(outs[0]), **attrs,
        ))  # fmt: skip

    def axes_op(self, op: str, src: str, out: str, axis: int, since: int, **attrs: Any) -> None:
        """Squeeze/Unsqueeze (axes an input from opset 13), ReduceMax (from 18)."""
        if self.opset >= since:
            self.op(op, [src, self.const(f"{out.lstrip('#')}_axes", [axis])], out, **attrs)
        else:
            self.op(op, [src], out, axes=[axis], **attrs)


def with_nms(model_bytes: bytes, fmt: Format, input_wh: tuple[int, int],
             settings: PostprocessSettings) -> bytes:  # fmt: skip
    """The model with post-processing appended: outputs :data:`OUTPUTS` (module doc)."""
    proto, opset = open_model(model_bytes, fmt, WHAT, MIN_OPSET)
    graph = proto.graph
    if len(graph.output) != 1:
        raise ModelError(f"expected one raw output, the model has {len(graph.output)}")
    raw = graph.output[0]
    if raw.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ModelError(f"output {raw.name!r} is not float32; in-graph post needs float32")
    b = _Builder(opset)
    _decode(b, raw.name, fmt, input_wh)
    _select(b, settings, anchors=_anchors(raw, fmt))
    graph.node.extend(b.nodes)
    graph.initializer.extend(b.inits)
    graph.output.remove(raw)
    graph.output.extend(_outputs())
    return checked_bytes(proto, WHAT)


def _anchors(raw: onnx.ValueInfoProto, fmt: Format) -> int:
    dims = raw.type.tensor_type.shape.dim
    if len(dims) != 3:
        raise ModelError(f"output {raw.name!r} has {len(dims)} axes; expected 3")
    anchors = dims[1 if fmt == "yolox" else 2].dim_value
    if anchors <= 0:
        raise ModelError(f"output {raw.name!r} needs a fixed number of anchors")
    return int(anchors)


def _decode(b: _Builder, raw: str, fmt: Format, input_wh: tuple[int, int]) -> None:
    """``raw`` -> ``boxes`` (B, A, 4) xyxy, ``score`` (B, A), ``cls_id`` (B, A) int64."""
    if fmt == "yolox":
        b.op("Identity", [f"#{raw}"], "rows")
    else:  # (B, 4 + C, A) -> (B, A, 4 + C)
        b.op("Transpose", [f"#{raw}"], "rows", perm=[0, 2, 1])
    axis = b.const("axis2", [2])
    first_class = 5 if fmt == "yolox" else 4
    parts = {"xy": (0, 2), "wh": (2, 4), "obj": (4, 5), "cls": (first_class, 2**62)}
    for part, (start, end) in parts.items():
        if part != "obj" or fmt == "yolox":
            lo, hi = b.const(f"{part}_lo", [start]), b.const(f"{part}_hi", [end])
            b.op("Slice", ["rows", lo, hi, axis], part)
    centre, size = "xy", "wh"
    if fmt == "yolox":
        grid = yolox_grid(*input_wh)
        b.const("grid", grid[None, :, :2], np.float32)
        b.const("stride", grid[None, :, 2:], np.float32)
        b.op("Add", ["xy", "grid"], "xy_grid")
        b.op("Mul", ["xy_grid", "stride"], "cxy")
        b.op("Min", ["wh", b.const("log_wh_max", 20.0, np.float32)], "log_wh")
        b.op("Exp", ["log_wh"], "wh_cells")
        b.op("Mul", ["wh_cells", "stride"], "wh_px")
        centre, size = "cxy", "wh_px"
    b.op("Mul", [size, b.const("half", 0.5, np.float32)], "wh_half")
    b.op("Sub", [centre, "wh_half"], "x1y1")
    b.op("Add", [centre, "wh_half"], "x2y2")
    b.op("Concat", ["x1y1", "x2y2"], "boxes", axis=2)
    b.axes_op("ReduceMax", "cls", "cls_best", 2, since=18, keepdims=0)
    b.op("ArgMax", ["cls"], "cls_id", axis=2, keepdims=0)
    if fmt == "yolox":
        b.axes_op("Squeeze", "obj", "obj1", 2, since=13)
        b.op("Mul", ["obj1", "cls_best"], "score")
    else:
        b.op("Identity", ["cls_best"], "score")


def _select(b: _Builder, settings: PostprocessSettings, anchors: int) -> None:
    """top-k -> class-aware NMS -> the kept rows of boxes, scores, classes."""
    k = b.const("k", [max(1, min(settings.pre_nms_top_k, anchors))])
    b.op("TopK", ["score", k], ["top_score", "top_idx"], axis=1, largest=1, sorted=1)
    b.op("GatherElements", ["cls_id", "top_idx"], "top_cls", axis=1)
    b.axes_op("Unsqueeze", "top_idx", "top_idx3", 2, since=13)
    b.op("Expand", ["top_idx3", b.const("box_shape", [1, 1, 4])], "top_idx4")  # broadcast
    b.op("GatherElements", ["boxes", "top_idx4"], "top_boxes", axis=1)
    b.op("Cast", ["top_cls"], "top_cls_f", to=TensorProto.FLOAT)
    b.op("Mul", ["top_cls_f", b.const("offset", CLASS_OFFSET, np.float32)], "shift")
    b.axes_op("Unsqueeze", "shift", "shift3", 2, since=13)
    b.op("Add", ["top_boxes", "shift3"], "nms_boxes")
    b.axes_op("Unsqueeze", "top_score", "nms_scores", 1, since=13)
    limits = [
        b.const("max_out", [settings.max_detections]),
        b.const("iou", [settings.nms_iou], np.float32),
        b.const("min_score", [settings.confidence_threshold], np.float32),
    ]
    b.op("NonMaxSuppression", ["nms_boxes", "nms_scores", *limits], "selected",
         center_point_box=0)  # fmt: skip
    b.op("Gather", ["selected", b.const("col0", [0])], "sel_b", axis=1)
    b.op("Gather", ["selected", b.const("col2", [2])], "sel_k", axis=1)
    b.op("Concat", ["sel_b", "sel_k"], "sel_bk", axis=1)
    b.op("GatherND", ["top_boxes", "sel_bk"], f"#{OUTPUTS[1]}")
    b.op("GatherND", ["top_score", "sel_bk"], f"#{OUTPUTS[2]}")
    b.op("GatherND", ["top_cls", "sel_bk"], f"#{OUTPUTS[3]}")
    b.axes_op("Squeeze", "sel_b", f"#{OUTPUTS[0]}", 1, since=13)


def _outputs() -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info(OUTPUTS[0], TensorProto.INT64, ["detections"]),
        helper.make_tensor_value_info(OUTPUTS[1], TensorProto.FLOAT, ["detections", 4]),
        helper.make_tensor_value_info(OUTPUTS[2], TensorProto.FLOAT, ["detections"]),
        helper.make_tensor_value_info(OUTPUTS[3], TensorProto.INT64, ["detections"]),
    ]


def split_detections(
    outputs: Sequence[NDArray[Any]], letterboxes: Sequence[Letterbox]
) -> list[Detections]:
    """The graph's rows -> one :class:`Detections` per image, boxes in source pixels."""
    batch, boxes, scores, classes = outputs
    batch = np.asarray(batch, dtype=np.int64).reshape(-1)
    order = np.argsort(batch, kind="stable")  # NMS emits image by image; be sure of it
    if not np.all(order[:-1] < order[1:]):
        batch, boxes, scores, classes = batch[order], boxes[order], scores[order], classes[order]
    bounds = np.searchsorted(batch, np.arange(len(letterboxes) + 1))
    out = []
    for i, lb in enumerate(letterboxes):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if lo == hi:
            out.append(Detections.empty())
            continue
        out.append(Detections(
            xyxy=lb.to_source(np.asarray(boxes[lo:hi], dtype=np.float32).reshape(-1, 4)),
            confidence=np.asarray(scores[lo:hi], dtype=np.float32),
            class_id=np.asarray(classes[lo:hi], dtype=np.int32),
        ))  # fmt: skip
    return out
