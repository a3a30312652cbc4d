"""A RESULT's payload: its detections as little-endian columns (re-exported by
:mod:`framerelay.wire`)."""

from __future__ import annotations

import numpy as np

from framerelay.detections import Detections
from framerelay.errors import ProtocolError
from framerelay.wire_envelope import DEFAULT_LIMITS, Limits

_ROW = 16 + 4 + 4 + 8  # xyxy f32x4, conf f32, class i32, tracker i64


def pack_detections(det: Detections) -> bytes:
    """Little-endian columns: xyxy, confidence, class_id, tracker_id."""
    return b"".join(
        (
            det.xyxy.astype("<f4").tobytes(),
            det.confidence.astype("<f4").tobytes(),
            det.class_id.astype("<i4").tobytes(),
            det.tracker_id.astype("<i8").tobytes(),
        )
    )


def unpack_detections(n: int, payload: bytes, limits: Limits = DEFAULT_LIMITS) -> Detections:
    """Inverse of :func:`pack_detections`; validates counts and values."""
    if n > limits.max_detections:
        raise ProtocolError(f"{n} detections exceed the limit of {limits.max_detections}")
    if len(payload) != n * _ROW:
        raise ProtocolError(
            f"result payload is {len(payload)} B, expected {n * _ROW} B for {n} detections"
        )
    if n == 0:
        return Detections.empty()
    xyxy = np.frombuffer(payload, "<f4", 4 * n, 0).reshape(n, 4)
    conf = np.frombuffer(payload, "<f4", n, 16 * n)
    cls = np.frombuffer(payload, "<i4", n, 20 * n)
    tid = np.frombuffer(payload, "<i8", n, 24 * n)
    try:
        return Detections(xyxy=xyxy, confidence=conf, class_id=cls, tracker_id=tid)
    except ValueError as exc:
        raise ProtocolError(f"invalid detections in result: {exc}") from None
