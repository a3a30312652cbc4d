"""A genuine second model for tests: "vehicles", derived from the shipped COCO YOLOX-Nano by
keeping only its car, bus and truck scores (:mod:`gpu_worker.detectors.class_subset`),
with its own canary (frame 1 of KITTI-17, one car) in a registry file."""

from __future__ import annotations

from pathlib import Path

from gpu_worker.detectors.class_subset import write_subset
from tests.conftest import MODEL, ROOT

VEHICLE_CLASSES = ("car", "bus", "truck")
COCO_INDICES = (2, 5, 7)
KITTI_STILL = ROOT / "samples" / "canary" / "kitti17-000001.jpg"
"""Frame 1 of MOTChallenge KITTI-17 (CC BY-NC-SA 3.0): a car at about 0.67 confidence."""
VEHICLES_VRAM_MB = 300


def write_registry(folder: Path, *, extra: str = "", vram_mb: float = VEHICLES_VRAM_MB) -> Path:
    """``folder/models.toml`` naming ``folder/vehicles.onnx`` (written here) and
    ``extra`` TOML after it."""
    write_subset(MODEL, folder / "vehicles.onnx", COCO_INDICES)
    path = folder / "models.toml"
    path.write_text(
        f"""
[models.vehicles]
file = "vehicles.onnx"
format = "yolox"
input_w = 416
input_h = 416
classes = {list(VEHICLE_CLASSES)!r}
vram_mb = {vram_mb}
canary = {{ image = "{KITTI_STILL}", expect = {{ car = 1 }}, min_confidence = 0.5 }}
{extra}"""
    )
    return path
