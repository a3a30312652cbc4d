"""Letterbox geometry shared by ingest (which letterboxes) and the worker
(which maps boxes back to source pixels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

PAD_VALUE = 114
"""Grey used to pad letterboxed images (the YOLOX/Ultralytics convention)."""


@dataclass(frozen=True, slots=True)
class Letterbox:
    """How a ``src_w`` x ``src_h`` frame was fitted into ``dst_w`` x ``dst_h``.

    The frame is resized by ``scale`` to ``new_w`` x ``new_h`` and pasted at
    ``(pad_x, pad_y)``; the rest is padded with :data:`PAD_VALUE`.
    """

    src_w: int
    src_h: int
    dst_w: int
    dst_h: int
    scale: float
    pad_x: int = 0
    pad_y: int = 0

    @classmethod
    def fit(cls, src_w: int, src_h: int, dst_w: int, dst_h: int) -> Letterbox:
        """Top-left letterbox keeping the aspect ratio (YOLOX style)."""
        if min(src_w, src_h, dst_w, dst_h) <= 0:
            raise ValueError(
                f"letterbox sizes must be positive: {src_w}x{src_h} -> {dst_w}x{dst_h}"
            )
        scale = min(dst_w / src_w, dst_h / src_h)
        return cls(src_w, src_h, dst_w, dst_h, scale)

    @property
    def new_w(self) -> int:
        return max(1, min(self.dst_w, round(self.src_w * self.scale)))

    @property
    def new_h(self) -> int:
        return max(1, min(self.dst_h, round(self.src_h * self.scale)))

    def to_source(self, xyxy: NDArray[np.float32]) -> NDArray[np.float32]:
        """Map model-input boxes back to source pixels, clipped to the frame."""
        out = xyxy.astype(np.float32, copy=True)
        out[:, [0, 2]] -= self.pad_x
        out[:, [1, 3]] -= self.pad_y
        out /= np.float32(self.scale)
        out[:, 0::2] = np.clip(out[:, 0::2], 0, self.src_w)
        out[:, 1::2] = np.clip(out[:, 1::2], 0, self.src_h)
        return out
