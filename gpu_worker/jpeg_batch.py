"""Decoding a batch of model-input JPEGs at once: on the CPU, or on the GPU with nvImageCodec.

A :class:`BatchJpegDecoder` takes the JPEG payloads of a batch and answers, in
order, each one's uint8 BGR (H, W, 3) image or the :class:`ProtocolError` that
:func:`~gpu_worker.images.decode_jpeg_bgr` would raise for it: one bad frame
never fails the others.

- :class:`CpuBatchDecoder`: simplejpeg, one image per call, spread over an
  executor's threads when one is given (simplejpeg releases the GIL).
- :class:`NvImgCodecDecoder`: one ``nvidia.nvimgcodec`` ``Decoder.decode`` call
  per batch (nvJPEG; on A100/H100/H200 its hardware JPEG engines), from the
  ``nvidia-nvimgcodec-cu12`` package of the ``gpu`` extra (``-cu13``: ``gpu-cu13``).
  Headers are checked on the CPU first, with the same messages as the CPU path.

:func:`make_decoder` picks one from the ``jpeg_decoder`` setting: ``cpu``,
``nvimgcodec`` (a clear :class:`ConfigError` where it cannot run), or ``auto``
(nvImageCodec where it imports and NVML sees a GPU, else the CPU).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from types import ModuleType
from typing import Any, Literal, Protocol

import numpy as np
import simplejpeg
from numpy.typing import NDArray

from framerelay.errors import ConfigError, ProtocolError
from gpu_worker.images import decode_jpeg_bgr

log = logging.getLogger(__name__)

Image = NDArray[np.uint8]
Decoded = Image | ProtocolError
JpegDecoderName = Literal["auto", "cpu", "cpu-batch", "nvimgcodec"]
NVIMGCODEC_MODULE = "nvidia.nvimgcodec"
INSTALL_HINT = (
    "install the gpu extra (pip install 'framerelay[gpu]', which brings "
    "nvidia-nvimgcodec-cu12; framerelay[gpu-cu13] for CUDA 13) on a machine with an NVIDIA "
    "GPU, or set "
    "FRAMERELAY_WORKER_JPEG_DECODER=cpu"
)


class BatchJpegDecoder(Protocol):
    """Decodes a batch of JPEGs of one size; blocking, call it off the event loop."""

    name: str

    def decode(self, items: Sequence[bytes], width: int, height: int) -> list[Decoded]:
        """Each item's BGR image or why it could not be decoded, in order."""
        ...


def _decode_one(data: bytes, width: int, height: int) -> Decoded:
    try:
        return decode_jpeg_bgr(data, width, height)
    except ProtocolError as exc:
        return exc


class CpuBatchDecoder:
    """simplejpeg, as :func:`~gpu_worker.images.decode_jpeg_bgr`, one image per thread."""

    name = "cpu"

    def __init__(self, pool: Executor | None = None) -> None:
        self._pool = pool

    def decode(self, items: Sequence[bytes], width: int, height: int) -> list[Decoded]:
        if self._pool is None or len(items) < 2:
            return [_decode_one(d, width, height) for d in items]
        futures = [self._pool.submit(_decode_one, d, width, height) for d in items]
        return [f.result() for f in futures]


def _header_error(data: bytes, width: int, height: int) -> ProtocolError | None:
    """The error :func:`decode_jpeg_bgr` gives before decoding, or ``None``."""
    try:
        w, h, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        return ProtocolError(f"undecodable JPEG: {exc}")
    if (w, h) != (width, height):
        return ProtocolError(f"image is {w}x{h}, the model input is {width}x{height}")
    return None


class NvImgCodecDecoder:
    """nvImageCodec: one batched GPU decode, images copied back as BGR numpy arrays."""

    name = "nvimgcodec"

    def __init__(self, module: ModuleType | None = None, **decoder_args: Any) -> None:
        """``decoder_args`` go to ``nvimgcodec.Decoder`` (``device_id``, ``backends``); by
        default the current CUDA device (``CUDA_VISIBLE_DEVICES`` pins a worker's GPU)."""
        self._nv = module if module is not None else load_nvimgcodec()
        try:
            # fancy_upsampling=1: chroma upsampled like libjpeg-turbo (simplejpeg), so the
            # pixels are close to the CPU path's (nvImageCodec's own default is off).
            options = decoder_args.pop("options", ":fancy_upsampling=1")
            self._decoder = self._nv.Decoder(options=options, **decoder_args)
            self._params = self._nv.DecodeParams(apply_exif_orientation=False)
        except Exception as exc:  # the binding raises RuntimeError and others
            raise ConfigError(
                f"nvImageCodec could not start a decoder: {exc}; {INSTALL_HINT}"
            ) from None
        self._lock = threading.Lock()  # one batch at a time per decoder

    def decode(self, items: Sequence[bytes], width: int, height: int) -> list[Decoded]:
        out: list[Decoded | None] = [_header_error(d, width, height) for d in items]
        todo = [i for i, err in enumerate(out) if err is None]
        if todo:
            for i, img in zip(todo, self._run([items[i] for i in todo]), strict=True):
                out[i] = self._to_bgr(img, width, height)
        return [o for o in out if o is not None]

    def _run(self, data: list[bytes]) -> list[Any]:
        """The batch decode; if the binding raises for the batch, each item alone."""
        with self._lock:
            try:
                return list(self._decoder.decode(data, params=self._params))
            except Exception as exc:  # one bad stream must not fail the batch
                log.debug("nvImageCodec batch decode failed (%s); decoding one by one", exc)
                return [self._one(d) for d in data]

    def _one(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data, params=self._params)
        except Exception as exc:
            return ProtocolError(f"undecodable JPEG: {exc}")

    @staticmethod
    def _to_bgr(img: Any, width: int, height: int) -> Decoded:
        if isinstance(img, ProtocolError):
            return img
        if img is None:
            return ProtocolError("undecodable JPEG: nvImageCodec could not decode it")
        rgb = np.asarray(img.cpu())
        if rgb.shape != (height, width, 3) or rgb.dtype != np.uint8:
            return ProtocolError(
                f"undecodable JPEG: decoded to {rgb.dtype} {rgb.shape}, "
                f"expected uint8 ({height}, {width}, 3)"
            )
        return np.ascontiguousarray(rgb[..., ::-1])


def load_nvimgcodec() -> ModuleType:
    """``nvidia.nvimgcodec``, or a :class:`ConfigError` saying how to get it."""
    try:
        return importlib.import_module(NVIMGCODEC_MODULE)
    except ImportError as exc:
        raise ConfigError(f"nvImageCodec is not installed ({exc}): {INSTALL_HINT}") from None
    except Exception as exc:  # a broken install (missing CUDA libraries) raises OSError etc.
        raise ConfigError(f"nvImageCodec does not load ({exc}): {INSTALL_HINT}") from None


def _gpu_missing() -> str | None:
    """Why no GPU can be used here (NVML's reason), or ``None`` when one can."""
    from gpu_worker.gpu_stats import read_gpus

    status = read_gpus()
    return None if status.available else status.reason or "no GPU seen"


def make_decoder(
    choice: str,
    pool: Executor | None = None,
    *,
    gpu_missing: Callable[[], str | None] = _gpu_missing,
) -> BatchJpegDecoder:
    """The decoder the ``jpeg_decoder`` setting asks for (``ConfigError`` where it cannot run)."""
    if choice not in ("auto", "cpu", "cpu-batch", "nvimgcodec"):
        raise ConfigError(
            f"jpeg_decoder must be auto, cpu, cpu-batch or nvimgcodec, not {choice!r}"
        )
    if choice in ("cpu", "cpu-batch"):
        return CpuBatchDecoder(pool)
    missing = gpu_missing()
    if choice == "nvimgcodec":
        if missing is not None:
            raise ConfigError(
                f"FRAMERELAY_WORKER_JPEG_DECODER=nvimgcodec: {missing}; {INSTALL_HINT}"
            )
        return NvImgCodecDecoder()
    if missing is not None:
        return CpuBatchDecoder(pool)
    try:
        return NvImgCodecDecoder()
    except ConfigError as exc:
        log.info("JPEG decode on the CPU: %s", exc)
        return CpuBatchDecoder(pool)


def stage_decoder(
    choice: str,
    pool: Executor | None = None,
    *,
    gpu_missing: Callable[[], str | None] = _gpu_missing,
) -> BatchJpegDecoder | None:
    """The decoder of the batcher's decode stage, or ``None`` where frames are decoded one
    by one as they arrive (``cpu``, and ``auto`` without a GPU).

    ``cpu-batch`` and ``nvimgcodec`` decode each batch at once in a stage in front of
    inference (the next batch decodes while this one infers), so the event loop hands off
    one job per batch instead of one per frame. ``auto`` with a GPU is ``cpu-batch``: on an
    H200 the bare decode + infer loop ran at 1,628-2,081 frames/s with it and 531-592 with
    nvImageCodec, whose decoded images go back to the host and up again (a device-resident
    batch would change that; ask for ``nvimgcodec`` explicitly meanwhile)."""
    if choice in ("cpu", "auto"):
        if choice == "cpu" or gpu_missing() is not None:
            return None
        return CpuBatchDecoder(pool)
    return make_decoder(choice, pool, gpu_missing=gpu_missing)


def decoder_in_use(decoder: BatchJpegDecoder | None) -> str:
    """The ``jpeg_decoder`` value that describes ``decoder`` (``/info``)."""
    if decoder is None:
        return "cpu"
    return "cpu-batch" if decoder.name == "cpu" else decoder.name
