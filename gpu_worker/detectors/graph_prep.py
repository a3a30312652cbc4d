"""Rewrite an ONNX detector so pre-processing runs inside its graph.

The worker decodes frames to uint8 BGR (N, H, W, 3). Today numpy turns them
into the model's float NCHW tensor on the CPU (``OnnxDetector._to_tensor``).
:func:`with_uint8_input` instead gives the model a uint8 NHWC BGR input and
prepends the same steps as ONNX nodes, so they run on whatever execution
provider runs the model (CUDA, TensorRT), and the host copies a quarter of
the bytes (uint8, not float32) to the device:

- ``Cast`` to the model's own input type (float32, or float16 for an FP16
  export), first, because TensorRT accepts uint8 only as a network input
  followed by a cast;
- ``Transpose`` NHWC -> NCHW;
- for Ultralytics exports, ``Gather`` of channels (2, 1, 0) (BGR -> RGB) and
  ``Mul`` by 1/255; YOLOX takes BGR 0..255 as it is.

The new input keeps the original input's name and batch axis (fixed or
symbolic, e.g. after :func:`~gpu_worker.detectors.batch_axis.dynamic_batch_model`),
so the caller feeds it under the same name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from framerelay.errors import ModelError
from gpu_worker.detectors.graph_edit import Format, checked_bytes, open_model

PREFIX = "framerelay_prep_"
WHAT = "pre-processing"
FLOAT_TYPES: dict[int, type[np.floating[Any]]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
}
MIN_OPSET = 7  # Mul with broadcasting; Cast, Transpose and Gather are older


def with_uint8_input(model_bytes: bytes, fmt: Format) -> bytes:
    """The model with a uint8 NHWC BGR input and its pre-processing in the graph."""
    proto, _ = open_model(model_bytes, fmt, WHAT, MIN_OPSET)
    graph = proto.graph
    original = _single_input(graph)
    elem = original.type.tensor_type.elem_type
    internal = f"{PREFIX}{original.name}"
    _rename_uses(graph, original.name, internal)
    nodes, inits = _prep_nodes(original.name, internal, elem, fmt)
    new_input = _uint8_nhwc(original)
    graph.input.remove(original)
    graph.input.insert(0, new_input)
    graph.initializer.extend(inits)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return checked_bytes(proto, WHAT)


def _single_input(graph: onnx.GraphProto) -> onnx.ValueInfoProto:
    """The one image input (initializers listed as inputs by old exporters are skipped)."""
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise ModelError(f"expected one image input, the model has {len(inputs)}")
    inp: onnx.ValueInfoProto = inputs[0]
    tensor = inp.type.tensor_type
    if tensor.elem_type not in FLOAT_TYPES:
        name = TensorProto.DataType.Name(tensor.elem_type)
        raise ModelError(f"input {inp.name!r} is {name}; expected FLOAT or FLOAT16")
    dims = tensor.shape.dim
    if len(dims) != 4 or dims[1].dim_value != 3:
        shape = [d.dim_value or d.dim_param or "?" for d in dims]
        raise ModelError(f"input {inp.name!r} is {shape}; expected NCHW with 3 channels")
    return inp


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        if _subgraphs_use(node, old):
            raise ModelError(f"input {old!r} is used inside a subgraph; cannot rewrite it")
    for out in graph.output:
        if out.name == old:
            raise ModelError(f"input {old!r} is also a graph output; cannot rewrite it")


def _subgraphs_use(node: onnx.NodeProto, name: str) -> bool:
    graphs: list[onnx.GraphProto] = []
    for attr in node.attribute:
        graphs.extend([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)
    return any(name in n.input for g in graphs for n in g.node)


def _prep_nodes(
    src: str, dst: str, elem: int, fmt: Format
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Cast -> Transpose [-> Gather BGR->RGB -> Mul 1/255], ending in ``dst``."""
    cast, nchw = f"{PREFIX}cast", f"{PREFIX}nchw"
    last = dst if fmt == "yolox" else nchw
    nodes = [
        helper.make_node("Cast", [src], [cast], to=elem, name=cast),
        helper.make_node("Transpose", [cast], [last], perm=[0, 3, 1, 2], name=nchw),
    ]
    if fmt == "yolox":
        return nodes, []
    order, scale, rgb = f"{PREFIX}rgb_order", f"{PREFIX}scale", f"{PREFIX}rgb"
    inits = [
        numpy_helper.from_array(np.array([2, 1, 0], np.int64), order),
        numpy_helper.from_array(np.array(1 / 255, FLOAT_TYPES[elem]), scale),
    ]
    nodes += [
        helper.make_node("Gather", [nchw, order], [rgb], axis=1, name=rgb),
        helper.make_node("Mul", [rgb, scale], [dst], name=f"{PREFIX}scale_mul"),
    ]
    return nodes, inits


def _uint8_nhwc(original: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """A uint8 (N, H, W, C) input with the original's name and dims (fixed or symbolic)."""
    dims = original.type.tensor_type.shape.dim
    shape: list[Any] = [d.dim_param or d.dim_value or None for d in dims]
    n, c, h, w = shape
    return helper.make_tensor_value_info(original.name, TensorProto.UINT8, [n, h, w, c])
