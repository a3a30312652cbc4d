"""Decoding of model-input images received over the tunnel."""

from __future__ import annotations

import numpy as np
import simplejpeg
from numpy.typing import NDArray

from framerelay.errors import ProtocolError


def decode_jpeg_bgr(data: bytes | memoryview, width: int, height: int) -> NDArray[np.uint8]:
    """Decode a letterboxed model-input JPEG to BGR, checking its size."""
    try:
        w, h, _, _ = simplejpeg.decode_jpeg_header(data)
        if (w, h) != (width, height):
            raise ProtocolError(f"image is {w}x{h}, the model input is {width}x{height}")
        out: NDArray[np.uint8] = simplejpeg.decode_jpeg(data, colorspace="BGR")
    except ValueError as exc:
        raise ProtocolError(f"undecodable JPEG: {exc}") from None
    return out
