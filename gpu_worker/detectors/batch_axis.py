"""Rewrite an ONNX model exported with batch size 1 to take any batch size.

Exports such as the YOLOX one fix the batch axis at 1 and bake ``[1, ...]``
into Reshape shapes. Setting the input/output batch axes symbolic and turning
those leading 1s into 0 ("copy this axis from the input") makes the graph
batchable. The caller must verify the rewrite (see ``OnnxDetector``): a model
whose leading 1 meant something else would give different numbers.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def dynamic_batch_model(model: bytes) -> bytes | None:
    """The rewritten model, or ``None`` if ``onnx`` is missing or it can't apply."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        log.info("the 'onnx' package is not installed; cannot make the batch axis dynamic")
        return None
    proto = onnx.load_from_string(model)
    graph = proto.graph
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if not dims or dims[0].dim_value != 1:
            return None
        dims[0].dim_param = "batch"
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        shape = numpy_helper.to_array(inits[node.input[1]]).copy()
        if shape.ndim == 1 and shape.size and shape[0] == 1:
            shape[0] = 0
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    del graph.value_info[:]
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        log.warning("dynamic-batch rewrite failed the ONNX checker: %s", exc)
        return None
    return bytes(proto.SerializeToString())
