"""Decoding of raw detector outputs into ``Detections``, and NMS (numpy only).

Two layouts are understood:

* **YOLOX** ``(B, A, 5 + C)``: per anchor ``[cx, cy, log w, log h, obj, cls...]``
  relative to a grid of strides 8/16/32 (the official export, no decode head);
  score = objectness x class score.
* **Ultralytics** YOLOv8/YOLO11 ``(B, 4 + C, A)``: per anchor
  ``[cx, cy, w, h, cls...]`` already in input pixels, no objectness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from framerelay.detections import Detections
from framerelay.geometry import Letterbox

F32 = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class PostprocessSettings:
    """Thresholds applied after the model."""

    confidence_threshold: float = 0.1
    nms_iou: float = 0.45
    max_detections: int = 300
    pre_nms_top_k: int = 1000


def yolox_grid(input_w: int, input_h: int, strides: tuple[int, ...] = (8, 16, 32)) -> F32:
    """(A, 3) rows of ``[grid_x, grid_y, stride]`` in the export's anchor order."""
    parts = []
    for s in strides:
        gh, gw = input_h // s, input_w // s
        ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([xs.ravel(), ys.ravel(), np.full(gh * gw, s)], axis=1))
    return np.concatenate(parts).astype(np.float32)


def decode_yolox(raw: F32, grid: F32, min_score: float = 0.0) -> tuple[F32, F32, NDArray[np.int32]]:
    """One image's YOLOX rows -> (xyxy, score, class) before thresholding.

    The export's objectness and class scores are probabilities (sigmoid, 0..1), so a
    row's score (objectness x class score) never exceeds its objectness: rows whose
    objectness is not above ``min_score`` cannot pass that threshold and are skipped
    before the exp and the argmax over the classes (about 4 % of the 3549 rows of a
    416 input remain at 0.1 on the sample clip)."""
    if raw.shape[0] != grid.shape[0]:
        raise ValueError(f"YOLOX output has {raw.shape[0]} anchors, grid expects {grid.shape[0]}")
    if min_score > 0.0:
        rows = np.flatnonzero(raw[:, 4] > min_score)
        raw, grid = raw[rows], grid[rows]
    stride = grid[:, 2]
    cx = (raw[:, 0] + grid[:, 0]) * stride
    cy = (raw[:, 1] + grid[:, 1]) * stride
    w = np.exp(np.minimum(raw[:, 2], 20.0)) * stride
    h = np.exp(np.minimum(raw[:, 3], 20.0)) * stride
    cls = raw[:, 5:]
    class_id = cls.argmax(axis=1).astype(np.int32)
    score = raw[:, 4] * cls[np.arange(cls.shape[0]), class_id]
    return _cxcywh_to_xyxy(cx, cy, w, h), score.astype(np.float32), class_id


def decode_ultralytics(raw: F32) -> tuple[F32, F32, NDArray[np.int32]]:
    """One image's Ultralytics ``(4 + C, A)`` output -> (xyxy, score, class)."""
    cls = raw[4:, :]
    class_id = cls.argmax(axis=0).astype(np.int32)
    score = cls[class_id, np.arange(cls.shape[1])]
    return _cxcywh_to_xyxy(raw[0], raw[1], raw[2], raw[3]), score.astype(np.float32), class_id


def _cxcywh_to_xyxy(cx: F32, cy: F32, w: F32, h: F32) -> F32:
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(np.float32)


def select(
    xyxy: F32,
    score: F32,
    class_id: NDArray[np.int32],
    letterbox: Letterbox,
    settings: PostprocessSettings,
) -> Detections:
    """Threshold, class-aware NMS, cap, and map boxes to source pixels."""
    keep = np.flatnonzero(score > settings.confidence_threshold)
    if keep.size > settings.pre_nms_top_k:
        keep = keep[np.argsort(-score[keep], kind="stable")[: settings.pre_nms_top_k]]
    xyxy, score, class_id = xyxy[keep], score[keep], class_id[keep]
    # Offsetting boxes by class makes one NMS pass class-aware.
    offset = class_id.astype(np.float32)[:, None] * np.float32(4096.0)
    kept = nms(xyxy + offset, score, settings.nms_iou)[: settings.max_detections]
    boxes = letterbox.to_source(xyxy[kept])
    return Detections(xyxy=boxes, confidence=score[kept], class_id=class_id[kept])


def nms(xyxy: F32, score: F32, iou_threshold: float) -> NDArray[np.intp]:
    """Greedy non-maximum suppression; returns kept indices by falling score."""
    order = np.argsort(-score, kind="stable")
    x1, y1, x2, y2 = xyxy[:, 0], xyxy[:, 1], xyxy[:, 2], xyxy[:, 3]
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    kept: list[int] = []
    while order.size:
        i = int(order[0])
        kept.append(i)
        rest = order[1:]
        iw = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
        ih = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
        inter = iw * ih
        iou = inter / np.maximum(area[i] + area[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(kept, dtype=np.intp)
