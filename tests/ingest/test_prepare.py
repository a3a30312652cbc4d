"""Letterbox + JPEG straight from the decoder's YUV planes."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import simplejpeg

from framerelay.geometry import PAD_VALUE
from gpu_worker.images import decode_jpeg_bgr
from ingest.prepare import Preparer

CLIP = (
    Path(__file__).resolve().parents[2]
    / "samples"
    / "mot15"
    / "TUD-Stadtmitte"
    / "TUD-Stadtmitte.mp4"
)


def solid_frame(w: int, h: int, bgr: tuple[int, int, int]) -> av.VideoFrame:
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = bgr
    return av.VideoFrame.from_ndarray(img, format="bgr24").reformat(format="yuv420p")


@pytest.mark.parametrize(
    ("w", "h", "new_w", "new_h"),
    [
        (640, 480, 416, 312),
        (1280, 720, 416, 234),
        (480, 640, 312, 416),
        (416, 416, 416, 416),
        (101, 77, 416, 317),
    ],
)
def test_letterbox_geometry_and_padding(w: int, h: int, new_w: int, new_h: int) -> None:
    prep = Preparer(416, 416, quality=95)
    out = prep.prepare(solid_frame(w, h, (200, 60, 30)))
    lb = out.letterbox
    assert (lb.src_w, lb.src_h, lb.new_w, lb.new_h) == (w, h, new_w, new_h)
    assert (lb.pad_x, lb.pad_y) == (0, 0)
    img = decode_jpeg_bgr(out.data, 416, 416)
    inside = img[4 : new_h - 4, 4 : new_w - 4].reshape(-1, 3).mean(axis=0)
    assert np.abs(inside - [200, 60, 30]).max() < 8
    if new_h < 410:
        pad = img[new_h + 4 :, :].reshape(-1, 3).mean(axis=0)
        assert np.abs(pad - PAD_VALUE).max() < 3


def test_jpeg_is_420_subsampled() -> None:
    prep = Preparer(416, 416)
    data = prep.prepare(solid_frame(640, 480, (10, 20, 30))).data
    _, _, _, subsampling = simplejpeg.decode_jpeg_header(data)
    assert subsampling == "420"


def test_real_frame_close_to_bgr_reference() -> None:
    prep = Preparer(416, 416, quality=90)
    with av.open(str(CLIP)) as c:
        frame = next(c.decode(video=0))
    out = prep.prepare(frame)
    lb = out.letterbox
    img = decode_jpeg_bgr(out.data, 416, 416)
    ref = frame.reformat(lb.new_w, lb.new_h, format="bgr24").to_ndarray()
    assert np.abs(img[: lb.new_h, : lb.new_w].astype(int) - ref).mean() < 4


@pytest.mark.parametrize(("w", "h", "q"), [(415, 416, 90), (416, 416, 0), (416, 416, 101)])
def test_bad_preparer_settings(w: int, h: int, q: int) -> None:
    with pytest.raises(ValueError):
        Preparer(w, h, q)
