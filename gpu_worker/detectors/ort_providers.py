"""ONNX Runtime's ``providers=[(name, options), ...]`` list, built by pure functions.

TensorRT gets FP16, an engine cache and a timing cache in one directory (a volume
in production, so only the first start on a GPU model builds engines), and one
explicit optimisation profile covering batch 1..``max_batch`` when the model's
batch axis is dynamic. CUDA (TensorRT's fallback for the nodes it does not take,
and the provider on its own) gets its device and a cuDNN search suited to batch
sizes that change from run to run. Option names are ONNX Runtime's (see its
TensorRT and CUDA execution provider pages); every value is a string, as its
Python binding wants. When provider options are given, ONNX Runtime ignores its
``ORT_TENSORRT_*`` environment variables, so these options are the whole truth.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from framerelay.errors import ConfigError

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GPU_PROVIDERS = frozenset({TENSORRT, CUDA})

PROVIDER_ORDER: dict[str, tuple[str, ...]] = {
    "auto": (TENSORRT, CUDA, CPU),
    "tensorrt": (TENSORRT, CUDA, CPU),
    "cuda": (CUDA, CPU),
    "cpu": (CPU,),
}

ProviderSpec = tuple[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The model's single image input: name, channels, height, width, batch axis."""

    input_name: str
    channels: int
    height: int
    width: int
    dynamic_batch: bool
    channels_last: bool = False
    """The input is NHWC (uint8 images, pre-processing in the graph), not NCHW."""

    def dims(self, batch: int) -> str:
        """TensorRT's ``NxCxHxW`` (or ``NxHxWxC``) spelling for one batch size."""
        if self.channels_last:
            return f"{batch}x{self.height}x{self.width}x{self.channels}"
        return f"{batch}x{self.channels}x{self.height}x{self.width}"


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """The detector settings that shape the GPU providers' options."""

    fp16: bool = True
    cache_dir: Path | None = None
    """Engine + timing cache directory; required when TensorRT is chosen."""
    max_batch: int = 1
    device_id: int = 0


def choose_providers(wanted: str, available: Iterable[str]) -> list[str]:
    """The preferred providers that this onnxruntime build offers, in order (CPU at least).

    onnxruntime-gpu lists CUDA and TensorRT even on a machine without a GPU; the
    session then falls back, so what is really used comes from the session.
    """
    if wanted not in PROVIDER_ORDER:
        raise ConfigError(f"unknown providers {wanted!r}; use one of {', '.join(PROVIDER_ORDER)}")
    offered = set(available)
    chosen = [p for p in PROVIDER_ORDER[wanted] if p in offered]
    return chosen or [CPU]


def tensorrt_profile(shape: ModelShape, max_batch: int) -> dict[str, str]:
    """One explicit profile: batch 1 (min) .. ``max_batch`` (opt and max).

    Opt is the largest batch because that is what a loaded worker runs; smaller
    batches still run on the same engine. Empty for a fixed batch axis, where
    TensorRT needs no profile.
    """
    if not shape.dynamic_batch:
        return {}
    name = shape.input_name
    return {
        "trt_profile_min_shapes": f"{name}:{shape.dims(1)}",
        "trt_profile_opt_shapes": f"{name}:{shape.dims(max_batch)}",
        "trt_profile_max_shapes": f"{name}:{shape.dims(max_batch)}",
    }


def tensorrt_options(options: GpuOptions, shape: ModelShape) -> dict[str, str]:
    if options.cache_dir is None:
        raise ConfigError("TensorRT needs an engine cache directory (engine_cache_dir)")
    cache = str(options.cache_dir)
    return {
        "device_id": str(options.device_id),
        "trt_fp16_enable": _flag(options.fp16),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": cache,
        **tensorrt_profile(shape, options.max_batch),
    }


def cuda_options(options: GpuOptions) -> dict[str, str]:
    """CUDA provider options; HEURISTIC cuDNN search, since an exhaustive one would
    run again for every new batch size (1..max_batch) in the middle of serving."""
    return {
        "device_id": str(options.device_id),
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "1",
    }


def build_providers(
    chosen: Iterable[str], options: GpuOptions, shape: ModelShape
) -> list[ProviderSpec]:
    """``chosen`` (from :func:`choose_providers`) with each provider's options."""
    specs: list[ProviderSpec] = []
    for name in chosen:
        if name == TENSORRT:
            specs.append((name, tensorrt_options(options, shape)))
        elif name == CUDA:
            specs.append((name, cuda_options(options)))
        else:
            specs.append((name, {}))
    return specs


def prepare_cache_dir(path: Path) -> Path:
    """Create ``path`` if needed and prove it writable; one-line :class:`ConfigError` if not."""
    hint = "set FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR to a writable directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"TensorRT engine cache {path} is not writable ({reason}); {hint}"
        ) from exc
    return path.resolve()


def on_gpu(providers: Iterable[str]) -> bool:
    """True when a session really runs on a GPU provider."""
    return any(p in GPU_PROVIDERS for p in providers)


def _flag(value: bool) -> str:
    return "1" if value else "0"


__all__ = [
    "CPU",
    "CUDA",
    "PROVIDER_ORDER",
    "TENSORRT",
    "GpuOptions",
    "ModelShape",
    "ProviderSpec",
    "build_providers",
    "choose_providers",
    "cuda_options",
    "on_gpu",
    "prepare_cache_dir",
    "tensorrt_options",
    "tensorrt_profile",
]
