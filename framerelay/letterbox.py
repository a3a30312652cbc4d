"""Letterbox a still RGB image to a model input and JPEG-encode it, in numpy.

The ingest letterboxes decoded video in YUV with PyAV's scaler
(``ingest.prepare``); services that only need a model input from a still
image (the orchestrator's canary) use this instead, so they import neither
PyAV nor the ingest. The result has the same layout as the ingest's: the
image resized keeping its aspect ratio (bilinear), pasted top-left on a
:data:`~framerelay.geometry.PAD_VALUE` grey canvas, encoded as 4:2:0 JPEG.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simplejpeg
from numpy.typing import NDArray

from framerelay.geometry import PAD_VALUE, Letterbox

U8 = NDArray[np.uint8]
F32 = NDArray[np.float32]
MAX_STILL_BYTES = 16 << 20
"""A still image file larger than this is refused before it is read."""


@dataclass(frozen=True, slots=True)
class LetterboxedJpeg:
    """An encoded model input and how it maps back to the source image."""

    data: bytes
    letterbox: Letterbox


def read_jpeg_rgb(path: Path) -> U8:
    """Decode the JPEG file at ``path`` to an (H, W, 3) RGB array."""
    size = path.stat().st_size
    if size > MAX_STILL_BYTES:
        raise ValueError(f"{path} is {size} bytes; a still image may have {MAX_STILL_BYTES}")
    try:
        rgb: U8 = simplejpeg.decode_jpeg(path.read_bytes(), colorspace="RGB")
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable JPEG: {exc}") from None
    return rgb


def _axis(src: int, dst: int) -> tuple[NDArray[np.intp], NDArray[np.intp], F32]:
    """Source indices below/above each destination pixel centre, and the weight above."""
    pos = (np.arange(dst, dtype=np.float32) + 0.5) * np.float32(src / dst) - 0.5
    pos = np.clip(pos, 0, src - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, src - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def resize_bilinear(image: U8, new_w: int, new_h: int) -> U8:
    """Resize an (H, W, C) uint8 image to (new_h, new_w, C), bilinear, pixel centres aligned."""
    if image.ndim != 3 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, C) uint8 image, got {image.dtype} {image.shape}")
    if new_w <= 0 or new_h <= 0:
        raise ValueError(f"resize target must be positive, got {new_w}x{new_h}")
    y0, y1, wy = _axis(image.shape[0], new_h)
    x0, x1, wx = _axis(image.shape[1], new_w)
    src = image.astype(np.float32)
    rows = src[y0] * (1 - wy)[:, None, None] + src[y1] * wy[:, None, None]
    out = rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def letterbox_jpeg(rgb: U8, dst_w: int, dst_h: int, quality: int = 90) -> LetterboxedJpeg:
    """Letterbox an (H, W, 3) RGB image into ``dst_w`` x ``dst_h`` and encode it as JPEG."""
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be 1..100, got {quality}")
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {rgb.dtype} {rgb.shape}")
    lb = Letterbox.fit(rgb.shape[1], rgb.shape[0], dst_w, dst_h)
    canvas = np.full((dst_h, dst_w, 3), PAD_VALUE, np.uint8)
    canvas[: lb.new_h, : lb.new_w] = resize_bilinear(rgb, lb.new_w, lb.new_h)
    data = simplejpeg.encode_jpeg(canvas, quality=quality, colorspace="RGB", colorsubsampling="420")
    return LetterboxedJpeg(data, lb)
