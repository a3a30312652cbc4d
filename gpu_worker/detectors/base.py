"""The detector contract: ``infer(batch) -> list[Detections]``.

Each backend lives in its own module and alone imports its library
(``onnxruntime``, ``ultralytics``). Backends are chosen by the ``type`` field of
their settings model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from framerelay.detections import Detections
from framerelay.geometry import Letterbox

ModelFormat = Literal["auto", "yolox", "ultralytics"]
ProviderName = Literal["auto", "tensorrt", "cuda", "cpu"]
IoBindingMode = Literal["auto", "on", "off"]
IMAGE_ENGINE_CACHE = Path("/var/cache/framerelay/trt")
"""The engine-cache volume of the CUDA image and the Kubernetes manifests."""


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One letterboxed image at the model's input size.

    ``image`` is uint8 (H, W, 3) in BGR order; ``letterbox`` maps boxes back.
    """

    image: NDArray[np.uint8]
    letterbox: Letterbox


class Detector(Protocol):
    """What the worker needs from a backend."""

    input_size: tuple[int, int]
    """Model input (width, height)."""
    class_names: tuple[str, ...]
    providers: tuple[str, ...]
    """Execution providers actually in use (e.g. ``CUDAExecutionProvider``)."""

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        """Detect objects in each image; boxes in source pixels. Blocking."""
        ...


@dataclass(frozen=True, slots=True)
class Acceleration:
    """What a backend really turned on (``/info`` and ``/metrics`` report it)."""

    fp16: bool = False
    """TensorRT is in use and builds FP16 engines."""
    io_binding: bool = False
    engine_cache_dir: Path | None = None
    """Set only while TensorRT is in use."""
    in_graph_prep: bool = False
    """The model takes uint8 NHWC BGR and converts it in its own graph (on the device)."""
    in_graph_post: bool = False
    """Box decode, top-k and NMS run in the model's graph; only kept boxes come back."""
    batch_buckets: tuple[int, ...] = ()
    """Batch sizes a batch is padded up to, each prepared at start (none: any size)."""
    artefact_cache: Literal["hit", "built"] | None = None
    """The start's built model came from the artefact cache (hit) or was built and stored
    there (built); None without a cache directory."""
    artefact_key: str | None = None

    def as_info(self) -> dict[str, object]:
        cache = None if self.engine_cache_dir is None else str(self.engine_cache_dir)
        return {"fp16": self.fp16, "io_binding": self.io_binding, "engine_cache_dir": cache,
                "in_graph_prep": self.in_graph_prep, "in_graph_post": self.in_graph_post,
                "batch_buckets": list(self.batch_buckets),
                "artefact_cache": self.artefact_cache,
                "artefact_key": self.artefact_key}  # fmt: skip


def acceleration_of(detector: object) -> Acceleration:
    """A backend's ``acceleration``; all off for one without it (Ultralytics, fakes)."""
    value = getattr(detector, "acceleration", None)
    return value if isinstance(value, Acceleration) else Acceleration()


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: Path = Field(description="Path of the model file.")
    confidence_threshold: float = Field(0.1, ge=0.0, le=1.0)
    nms_iou: float = Field(0.45, gt=0.0, le=1.0)
    max_detections: int = Field(300, ge=1, le=10_000)
    max_batch: int = Field(8, ge=1, le=256, description="Largest batch one run takes.")


class OnnxDetectorSettings(_Common):
    """ONNX Runtime backend (TensorRT -> CUDA -> CPU)."""

    type: Literal["onnx"] = "onnx"
    format: ModelFormat = "auto"
    providers: ProviderName = Field(
        "auto", description="'auto' tries TensorRT, then CUDA, then CPU."
    )
    threads: int = Field(0, ge=0, le=256, description="CPU intra-op threads; 0 = ORT default.")
    spin: bool = Field(
        False, description="Let ORT threads busy-wait (faster alone, slower when sharing cores)."
    )
    class_names: tuple[str, ...] | None = None
    fp16: bool = Field(
        True, description="TensorRT builds FP16 engines (no effect on the CUDA and CPU providers)."
    )
    engine_cache_dir: Path | None = Field(
        None,
        description="TensorRT engine and timing caches; None: the image's volume "
        "/var/cache/framerelay/trt when writable, else $XDG_CACHE_HOME/framerelay/trt.",
    )
    cache_dir: Path | None = Field(
        None,
        description="Built artefacts (the prepared graph, ONNX Runtime's optimised model, "
        "TensorRT engines), one directory per model digest, providers, machine and "
        "settings; put it on a network volume so a second worker of the same GPU type "
        "starts without building. None: no artefact cache.",
    )
    io_binding: IoBindingMode = Field(
        "auto",
        description="Bind input/output buffers (input on the device, output to pinned memory); "
        "auto: on when a GPU provider is in use.",
    )
    in_graph_prep: IoBindingMode = Field(
        "auto",
        description="Feed the model uint8 NHWC BGR and do its cast/transpose (and for "
        "Ultralytics exports BGR->RGB, /255) inside the graph, on the device; auto: on when "
        "a GPU provider is chosen (on the CPU numpy does the same work).",
    )
    in_graph_post: IoBindingMode = Field(
        "auto",
        description="Decode boxes, keep the top scores and run class-aware NMS inside the "
        "graph for the whole batch, on the device, so only kept boxes reach the host; auto: "
        "on when a GPU provider is chosen (on the CPU numpy gives the same detections).",
    )
    batch_buckets: IoBindingMode = Field(
        "auto",
        description="Pad each batch up to the next power of two (or max_batch) and run every "
        "such size once at start, so ONNX Runtime never prepares a new input shape (seconds "
        "each on CUDA) while serving; auto: on when a GPU provider is chosen.",
    )

    def engine_cache_path(self) -> Path:
        """Where TensorRT keeps engines and timing caches (not created here); with
        ``cache_dir`` set the detector uses a keyed directory under it (``<path>/<key>``),
        and without ``engine_cache_dir`` the path is ``<cache_dir>/trt``."""
        if self.engine_cache_dir is not None:
            return self.engine_cache_dir
        if self.cache_dir is not None:
            return self.cache_dir / "trt"
        if IMAGE_ENGINE_CACHE.is_dir() and os.access(IMAGE_ENGINE_CACHE, os.W_OK | os.X_OK):
            return IMAGE_ENGINE_CACHE
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
        return base / "framerelay" / "trt"


class UltralyticsDetectorSettings(_Common):
    """Ultralytics backend for ``.pt`` models (the ``[ultralytics]`` extra)."""

    type: Literal["ultralytics"] = "ultralytics"
    device: str = Field("", description="'' lets Ultralytics choose; e.g. 'cpu', 'cuda:0'.")


DetectorSettings = OnnxDetectorSettings | UltralyticsDetectorSettings
