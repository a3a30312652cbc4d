"""Derive a detector that reports only some of a YOLOX model's classes.

A YOLOX output row is ``[cx, cy, log w, log h, objectness, score_0 .. score_C-1]``.
:func:`keep_classes` appends one ``Gather`` on the last axis that keeps the box,
the objectness and the chosen class scores, in the order given, so the derived
model is a real ``C'``-class YOLOX detector with the same weights (e.g. COCO's
car, bus and truck as a 3-class "vehicles" model). Its class names go in the
model registry (:mod:`framerelay.model_registry`); the file has no ``names``
metadata, so it is read as YOLOX.

``python -m gpu_worker.detectors.class_subset SRC DST 2 5 7`` writes one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

from framerelay.errors import FramerelayError, ModelError
from gpu_worker.detectors.graph_edit import checked_bytes, open_model

WHAT = "class subset"
BOX_AND_OBJECTNESS = 5
PREFIX = "framerelay_subset_"


def keep_classes(model_bytes: bytes, keep: Sequence[int]) -> bytes:
    """The model with only the class scores ``keep`` (indices into its classes)."""
    proto, _ = open_model(model_bytes, "yolox", WHAT, min_opset=1)
    graph = proto.graph
    if len(graph.output) != 1:
        raise ModelError(f"a YOLOX model has one output, this one has {len(graph.output)}")
    out = graph.output[0]
    dims = out.type.tensor_type.shape.dim
    classes = dims[-1].dim_value - BOX_AND_OBJECTNESS if dims else 0
    if classes <= 0:
        raise ModelError(f"output {out.name!r} has no fixed class axis")
    _check_indices(keep, classes)
    rows = [*range(BOX_AND_OBJECTNESS), *(BOX_AND_OBJECTNESS + k for k in keep)]
    index = numpy_helper.from_array(np.asarray(rows, np.int64), PREFIX + "rows")
    old, new = out.name, PREFIX + "scores"
    graph.initializer.append(index)
    graph.node.append(helper.make_node("Gather", [new, index.name], [old], axis=-1))
    for node in graph.node[:-1]:  # the old output now feeds the Gather
        node.output[:] = [new if o == old else o for o in node.output]
    dims[-1].dim_value = len(rows)
    return checked_bytes(proto, WHAT)


def _check_indices(keep: Sequence[int], classes: int) -> None:
    if not keep:
        raise ModelError("keep at least one class")
    bad = [k for k in keep if not 0 <= k < classes]
    if bad:
        raise ModelError(f"class indices {bad} are outside the model's 0..{classes - 1}")
    if len(set(keep)) != len(keep):
        raise ModelError(f"class indices repeat: {list(keep)}")


def write_subset(src: Path, dst: Path, keep: Sequence[int]) -> Path:
    """Read ``src``, write the derived model to ``dst``; returns ``dst``."""
    try:
        data = src.read_bytes()
    except OSError as exc:
        raise ModelError(f"cannot read {src}: {exc.strerror}") from None
    dst.write_bytes(keep_classes(data, keep))
    return dst


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m gpu_worker.detectors.class_subset SRC DST INDEX...")
        return 2
    try:
        write_subset(Path(argv[0]), Path(argv[1]), [int(a) for a in argv[2:]])
    except (FramerelayError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
