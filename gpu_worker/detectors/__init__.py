"""Detector backends, chosen by the settings' ``type``."""

from __future__ import annotations

from pathlib import Path

from framerelay.errors import ModelError
from gpu_worker.detectors.base import (
    Detector,
    DetectorSettings,
    ModelInput,
    OnnxDetectorSettings,
    UltralyticsDetectorSettings,
)

__all__ = [
    "Detector",
    "DetectorSettings",
    "ModelInput",
    "OnnxDetectorSettings",
    "UltralyticsDetectorSettings",
    "load_detector",
    "settings_for_model",
]


def settings_for_model(model: Path, **overrides: object) -> DetectorSettings:
    """Pick the backend from the file suffix (``.onnx`` or ``.pt``)."""
    if model.suffix == ".pt":
        return UltralyticsDetectorSettings.model_validate({"model": model, **overrides})
    return OnnxDetectorSettings.model_validate({"model": model, **overrides})


def load_detector(settings: DetectorSettings) -> Detector:
    """Build the backend named by ``settings.type`` (imports its library lazily)."""
    if not settings.model.is_file():
        raise ModelError(f"model file not found: {settings.model}")
    if isinstance(settings, OnnxDetectorSettings):
        from gpu_worker.detectors.onnx_backend import OnnxDetector

        return OnnxDetector(settings)
    from gpu_worker.detectors.ultralytics_backend import UltralyticsDetector

    return UltralyticsDetector(settings)
