"""Batch JPEG decoding: the CPU decoder, the nvImageCodec wrapper, and the choice between them."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import simplejpeg
from numpy.typing import NDArray

from framerelay.errors import ConfigError, ProtocolError
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb
from gpu_worker.images import decode_jpeg_bgr
from gpu_worker.jpeg_batch import (
    CpuBatchDecoder,
    NvImgCodecDecoder,
    make_decoder,
)
from tests.support.detector_io import first_frames

ROOT = Path(__file__).resolve().parents[2]
STILL = ROOT / "samples" / "mot15" / "TUD-Stadtmitte" / "frame-000001.jpg"
W = H = 416


def _jpegs() -> list[bytes]:
    """Model-input JPEGs as they arrive: the still letterboxed by the canary's code, the
    clip's first frames letterboxed as the ingest does and encoded 4:2:0."""
    still = letterbox_jpeg(read_jpeg_rgb(STILL), W, H).data
    frames = [
        simplejpeg.encode_jpeg(f.image, quality=90, colorspace="BGR", colorsubsampling="420")
        for f in first_frames(3)
    ]
    return [still, *frames]


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    return _jpegs()


def _bad(good: bytes) -> dict[str, bytes]:
    return {
        "garbage": b"not a jpeg at all",
        "truncated": good[: len(good) // 2],
        "wrong size": simplejpeg.encode_jpeg(np.zeros((8, 16, 3), np.uint8), colorspace="BGR"),
    }


def _cpu_error(data: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        decode_jpeg_bgr(data, W, H)
    return str(info.value)


@pytest.fixture(params=[None, 2], ids=["inline", "pool"])
def cpu(request: pytest.FixtureRequest) -> Iterator[CpuBatchDecoder]:
    if request.param is None:
        yield CpuBatchDecoder()
        return
    with ThreadPoolExecutor(request.param) as pool:
        yield CpuBatchDecoder(pool)


def test_cpu_gives_the_same_pixels_as_decode_jpeg_bgr(
    cpu: CpuBatchDecoder, jpegs: list[bytes]
) -> None:
    out = cpu.decode(jpegs, W, H)
    assert len(out) == len(jpegs)
    for data, image in zip(jpegs, out, strict=True):
        assert isinstance(image, np.ndarray)
        np.testing.assert_array_equal(image, decode_jpeg_bgr(data, W, H))


@pytest.mark.parametrize("kind", ["garbage", "truncated", "wrong size"])
def test_cpu_bad_item_fails_alone(cpu: CpuBatchDecoder, jpegs: list[bytes], kind: str) -> None:
    bad = _bad(jpegs[0])[kind]
    batch = [jpegs[0], jpegs[1], bad, jpegs[2]]
    out = cpu.decode(batch, W, H)
    assert isinstance(out[2], ProtocolError) and str(out[2]) == _cpu_error(bad)
    for i in (0, 1, 3):
        image = out[i]
        assert isinstance(image, np.ndarray)
        np.testing.assert_array_equal(image, decode_jpeg_bgr(batch[i], W, H))


def test_cpu_empty_batch() -> None:
    assert CpuBatchDecoder().decode([], W, H) == []


# nvImageCodec's wrapping (header checks, None, a batch that raises, RGB -> BGR), checked
# on the CPU with a stand-in module that decodes with simplejpeg. The real library is
# checked by the gpu-marked test below.


class _FakeDecoder:
    def __init__(self, *, device_id: int, options: str, raise_batch: bool) -> None:
        self.options = options
        self.raise_batch = raise_batch
        self.calls: list[int] = []

    def decode(self, srcs: Any, params: Any = None) -> Any:
        if isinstance(srcs, bytes):
            return self._one(srcs)
        self.calls.append(len(srcs))
        if self.raise_batch:
            raise RuntimeError("batch failed")
        return [self._one(s) for s in srcs]

    @staticmethod
    def _one(data: bytes) -> Any:
        try:
            rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            return None
        return SimpleNamespace(cpu=lambda: rgb)


def _fake_module(raise_batch: bool = False) -> Any:
    decoder = _FakeDecoder(device_id=0, options="", raise_batch=raise_batch)

    def make(options: str) -> _FakeDecoder:
        decoder.options = options
        return decoder

    return SimpleNamespace(Decoder=make, DecodeParams=lambda **_: object(), decoder=decoder)


@pytest.mark.parametrize("raise_batch", [False, True], ids=["batch", "batch-raises"])
def test_nvimgcodec_wrapper_maps_each_item(jpegs: list[bytes], raise_batch: bool) -> None:
    module = _fake_module(raise_batch)
    dec = NvImgCodecDecoder(module)
    bad = _bad(jpegs[0])
    batch = [jpegs[0], bad["garbage"], jpegs[1], bad["truncated"], bad["wrong size"], jpegs[2]]
    out = dec.decode(batch, W, H)
    assert module.decoder.options == ":fancy_upsampling=1"
    # Only the items whose header is fine reach the GPU, in one call.
    assert module.decoder.calls == [4]
    for i in (0, 2, 5):
        image = out[i]
        assert isinstance(image, np.ndarray) and image.flags.c_contiguous
        np.testing.assert_array_equal(image, decode_jpeg_bgr(batch[i], W, H))
    assert str(out[1]) == _cpu_error(bad["garbage"])
    assert str(out[4]) == _cpu_error(bad["wrong size"])
    assert isinstance(out[3], ProtocolError) and "undecodable JPEG" in str(out[3])


def test_nvimgcodec_decoder_that_cannot_start_is_one_line() -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("CUDA driver version is insufficient")

    module: Any = SimpleNamespace(Decoder=broken, DecodeParams=lambda **_: None)
    with pytest.raises(ConfigError, match="could not start a decoder: CUDA driver") as info:
        NvImgCodecDecoder(module)
    assert "\n" not in str(info.value)


def _nvimgcodec_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:
        return False


def test_choice_cpu_and_auto_without_a_gpu() -> None:
    assert make_decoder("cpu").name == "cpu"
    assert make_decoder("auto", gpu_missing=lambda: "no NVIDIA driver").name == "cpu"


@pytest.mark.skipif(_nvimgcodec_installed(), reason="nvImageCodec is installed here")
def test_choice_auto_with_a_gpu_but_no_nvimgcodec_is_cpu() -> None:
    assert make_decoder("auto", gpu_missing=lambda: None).name == "cpu"


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("no NVIDIA driver", "nvimgcodec: no NVIDIA driver; install the gpu extra"),
        (None, "nvImageCodec is not installed"),
    ],
)
def test_choice_nvimgcodec_where_it_cannot_run_is_one_line(
    missing: str | None, message: str
) -> None:
    if missing is None and _nvimgcodec_installed():
        pytest.skip("nvImageCodec is installed here")
    with pytest.raises(ConfigError, match=message) as info:
        make_decoder("nvimgcodec", gpu_missing=lambda: missing)
    assert "\n" not in str(info.value) and "FRAMERELAY_WORKER_JPEG_DECODER" in str(info.value)


def test_unknown_choice() -> None:
    with pytest.raises(ConfigError, match="auto, cpu, cpu-batch or nvimgcodec"):
        make_decoder("turbo")


def _nvimgcodec_or_skip() -> NvImgCodecDecoder:
    if not _nvimgcodec_installed():
        pytest.skip("nvImageCodec is not installed (pip install 'framerelay[gpu]')")
    decoder = make_decoder("auto")
    if not isinstance(decoder, NvImgCodecDecoder):
        pytest.skip("nvImageCodec is installed but no GPU is usable here")
    return decoder


def _close(gpu: NDArray[np.uint8], cpu: NDArray[np.uint8]) -> None:
    """Different IDCTs and upsampling: a few levels apart at most, most pixels equal."""
    diff = np.abs(gpu.astype(np.int16) - cpu.astype(np.int16))
    assert gpu.shape == cpu.shape
    assert diff.mean() < 1.0, f"mean difference {diff.mean():.2f}"
    assert np.percentile(diff, 99.9) <= 8, f"99.9th percentile {np.percentile(diff, 99.9)}"


@pytest.mark.gpu
def test_nvimgcodec_on_the_gpu_matches_the_cpu(jpegs: list[bytes]) -> None:
    gpu = _nvimgcodec_or_skip()
    bad = _bad(jpegs[0])
    batch = [*jpegs, bad["garbage"], jpegs[0], bad["wrong size"]]
    out = gpu.decode(batch, W, H)
    assert len(out) == len(batch)
    for i in (*range(len(jpegs)), len(jpegs) + 1):
        image = out[i]
        assert isinstance(image, np.ndarray), f"item {i}: {image}"
        _close(image, decode_jpeg_bgr(batch[i], W, H))
    assert isinstance(out[len(jpegs)], ProtocolError)
    assert isinstance(out[-1], ProtocolError)
    # A truncated JPEG: an error, or (nvJPEG being lenient) an image of the right size;
    # either way the rest of the batch is decoded.
    batch = [jpegs[1], bad["truncated"], jpegs[2]]
    out = gpu.decode(batch, W, H)
    truncated = out[1]
    assert isinstance(truncated, ProtocolError) or truncated.shape == (H, W, 3)
    for i in (0, 2):
        image = out[i]
        assert isinstance(image, np.ndarray)
        _close(image, decode_jpeg_bgr(batch[i], W, H))
