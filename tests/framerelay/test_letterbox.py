"""Letterbox + JPEG of a still image in numpy (the canary's model input)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import simplejpeg

from framerelay.geometry import PAD_VALUE
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb, resize_bilinear
from gpu_worker.images import decode_jpeg_bgr
from ingest.prepare import Preparer
from tests.conftest import CLIP, ROOT, STADTMITTE

STILL = STADTMITTE / "frame-000001.jpg"


def solid(w: int, h: int, rgb: tuple[int, int, int]) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = rgb
    return img


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
def test_geometry_and_padding(w: int, h: int, new_w: int, new_h: int) -> None:
    out = letterbox_jpeg(solid(w, h, (30, 60, 200)), 416, 416, quality=95)
    lb = out.letterbox
    assert (lb.src_w, lb.src_h, lb.new_w, lb.new_h) == (w, h, new_w, new_h)
    img = decode_jpeg_bgr(out.data, 416, 416)
    inside = img[4 : new_h - 4, 4 : new_w - 4].reshape(-1, 3).mean(axis=0)
    assert np.abs(inside - [200, 60, 30]).max() < 8
    if new_h < 410:
        pad = img[new_h + 4 :, :].reshape(-1, 3).mean(axis=0)
        assert np.abs(pad - PAD_VALUE).max() < 3
    assert simplejpeg.decode_jpeg_header(out.data)[3] == "420"


def test_resize_identity_and_gradient() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    assert np.array_equal(resize_bilinear(img, 53, 37), img)
    ramp = np.repeat(np.arange(0, 256, 2, dtype=np.uint8)[None, :, None], 4, axis=0)
    half = resize_bilinear(ramp, 64, 4)[0, :, 0].astype(int)
    assert np.abs(half - (np.arange(64) * 4 + 1)).max() <= 1  # mean of each pixel pair


def test_matches_the_ingest_preparer_on_the_canary_frame() -> None:
    """The still path and the ingest's YUV path give nearly the same model input."""
    with av.open(str(CLIP)) as container:
        ingest = Preparer(416, 416).prepare(next(container.decode(video=0)))
    still = letterbox_jpeg(read_jpeg_rgb(STILL), 416, 416)
    assert still.letterbox == ingest.letterbox
    a = decode_jpeg_bgr(ingest.data, 416, 416).astype(np.int16)
    b = decode_jpeg_bgr(still.data, 416, 416).astype(np.int16)
    assert np.abs(a - b).mean() < 4


@pytest.mark.parametrize(
    ("image", "quality", "match"),
    [
        (np.zeros((4, 4), np.uint8), 90, "RGB image"),
        (np.zeros((4, 4, 3), np.float32), 90, "RGB image"),
        (np.zeros((4, 4, 4), np.uint8), 90, "RGB image"),
        (np.zeros((4, 4, 3), np.uint8), 0, "quality"),
        (np.zeros((4, 4, 3), np.uint8), 101, "quality"),
    ],
)
def test_bad_inputs_are_refused(image: np.ndarray, quality: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        letterbox_jpeg(image, 416, 416, quality)


def test_bad_still_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="not a readable JPEG"):
        read_jpeg_rgb(bad)


def test_canary_image_imports_no_video_decoder_nor_service() -> None:
    """The orchestrator builds its canary input without PyAV, the ingest or the worker."""
    code = (
        "import sys; from deploy.health import Canary; img = Canary().image(416, 416); "
        "assert (img.src_w, img.src_h, img.scale) == (640, 480, 0.65), img; "
        "bad = [m for m in ('av', 'ingest', 'gpu_worker') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
