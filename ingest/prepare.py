"""Letterbox a decoded frame to the model input and JPEG-encode it, in YUV.

The frame never goes through BGR on the ingest side: swscale resizes the
decoder's planes straight to full-range 4:2:0 (JPEG's range), the planes are
pasted top-left into grey canvases, and simplejpeg encodes the planes (4:2:0).
The worker decodes the JPEG to BGR for the model (``gpu_worker.images``).

A frame whose letterbox the wire cannot carry (a scale above
:data:`MAX_SCALE`, a side above :data:`MAX_SIDE`: sources are size-checked
before, this is the second line) raises :class:`Unsendable` before any work,
for the caller to drop and count, never to reach the sender.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np
import simplejpeg
from av.video.reformatter import ColorRange, Interpolation, VideoReformatter
from numpy.typing import NDArray

from framerelay.geometry import PAD_VALUE, Letterbox
from framerelay.wire import MAX_SCALE, MAX_SIDE

U8 = NDArray[np.uint8]
_CHROMA_NEUTRAL = 128


class Unsendable(ValueError):
    """The frame's letterbox is outside what the wire carries: drop it and count it."""


def check_sendable(lb: Letterbox) -> None:
    """Raise :class:`Unsendable` unless ``lb`` fits the wire's FRAME header."""
    if not 0 < lb.scale <= MAX_SCALE or not (0 < lb.src_w <= MAX_SIDE and 0 < lb.src_h <= MAX_SIDE):
        raise Unsendable(
            f"a {lb.src_w}x{lb.src_h} frame letterboxed to {lb.dst_w}x{lb.dst_h} has scale "
            f"{lb.scale:g}; the wire carries scale <= {MAX_SCALE:g} and sides <= {MAX_SIDE}"
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """An encoded model input and how it maps back to the source frame."""

    data: bytes
    letterbox: Letterbox


def plane_array(plane: av.video.plane.VideoPlane, width: int, height: int) -> U8:
    """A (height, width) view of a plane, without its line padding."""
    buf: U8 = np.frombuffer(memoryview(plane), np.uint8)
    return buf.reshape(-1, plane.line_size)[:height, :width]


class Preparer:
    """Per-stream letterbox + encode; keeps its scaler and canvases between frames.

    Not thread-safe: use one per stream (its decode thread).
    """

    def __init__(self, input_w: int, input_h: int, quality: int = 90) -> None:
        if input_w % 2 or input_h % 2:
            raise ValueError(f"model input must have even sides for 4:2:0, got {input_w}x{input_h}")
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be 1..100, got {quality}")
        self.input_w, self.input_h, self.quality = input_w, input_h, quality
        self._scaler = VideoReformatter()
        self._canvas: tuple[U8, U8, U8] | None = None
        self._last_size: tuple[int, int] | None = None

    def _canvases(self, new_w: int, new_h: int) -> tuple[U8, U8, U8]:
        if self._canvas is None or self._last_size != (new_w, new_h):
            w, h = self.input_w, self.input_h
            self._canvas = (
                np.full((h, w), PAD_VALUE, np.uint8),
                np.full((h // 2, w // 2), _CHROMA_NEUTRAL, np.uint8),
                np.full((h // 2, w // 2), _CHROMA_NEUTRAL, np.uint8),
            )
            self._last_size = (new_w, new_h)
        return self._canvas

    def prepare(self, frame: av.VideoFrame) -> Prepared:
        """Letterbox ``frame`` into the model input and encode it as JPEG."""
        lb = Letterbox.fit(frame.width, frame.height, self.input_w, self.input_h)
        check_sendable(lb)
        small = self._scaler.reformat(
            frame,
            width=lb.new_w,
            height=lb.new_h,
            format="yuv420p",
            interpolation=Interpolation.BILINEAR,
            dst_color_range=ColorRange.JPEG,
        )
        y, u, v = self._canvases(lb.new_w, lb.new_h)
        cw, ch = (lb.new_w + 1) // 2, (lb.new_h + 1) // 2
        y[: lb.new_h, : lb.new_w] = plane_array(small.planes[0], lb.new_w, lb.new_h)
        u[:ch, :cw] = plane_array(small.planes[1], cw, ch)
        v[:ch, :cw] = plane_array(small.planes[2], cw, ch)
        data = simplejpeg.encode_jpeg_yuv_planes(y, u, v, quality=self.quality)
        return Prepared(data, lb)
