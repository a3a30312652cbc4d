"""The detector contract: ``infer(batch) -> list[Detections]``.

Each backend lives in its own module and alone imports its library
(``onnxruntime``, ``ultralytics``). Backends are chosen by the ``type`` field of
their settings model.
"""

from __future__ import annotations

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


class UltralyticsDetectorSettings(_Common):
    """Ultralytics backend for ``.pt`` models (the ``[ultralytics]`` extra)."""

    type: Literal["ultralytics"] = "ultralytics"
    device: str = Field("", description="'' lets Ultralytics choose; e.g. 'cpu', 'cuda:0'.")


DetectorSettings = OnnxDetectorSettings | UltralyticsDetectorSettings
