"""What the in-graph rewrites share: open a detector's ONNX model, check its format and
opset, and serialise it again after checking the result (:mod:`graph_prep`,
:mod:`graph_post`)."""

from __future__ import annotations

from typing import Literal

import onnx

from framerelay.errors import ModelError

Format = Literal["yolox", "ultralytics"]


def open_model(model_bytes: bytes, fmt: str, what: str, min_opset: int
               ) -> tuple[onnx.ModelProto, int]:  # fmt: skip
    """The parsed model and its default-domain opset; ``what`` names the rewrite in errors
    (``pre-processing``)."""
    if fmt not in ("yolox", "ultralytics"):
        raise ModelError(f"in-graph {what} knows 'yolox' and 'ultralytics', not {fmt!r}")
    try:
        proto = onnx.load_from_string(model_bytes)
    except Exception as exc:  # protobuf raises DecodeError and others
        raise ModelError(f"not an ONNX model: {exc}") from None
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < min_opset:
        raise ModelError(
            f"in-graph {what} needs ONNX opset >= {min_opset}, the model has "
            f"{opset}; re-export it with a newer opset"
        )
    return proto, opset


def checked_bytes(proto: onnx.ModelProto, what: str) -> bytes:
    """The rewritten model, once ONNX's checker accepts it."""
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"in-graph {what} made an invalid model: {exc}") from None
    return bytes(proto.SerializeToString())
