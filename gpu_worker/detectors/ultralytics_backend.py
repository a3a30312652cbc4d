"""Ultralytics backend: runs YOLOv8/YOLO11/YOLO26 ``.pt`` detection models.

Needs the ``[ultralytics]`` extra (Ultralytics, PyTorch and torchvision). This
module alone imports them, lazily, the first time a model is loaded.

Geometry: ingest already letterboxed every frame to :attr:`input_size`, a
multiple of the model stride. Ultralytics' own letterbox is then the identity
(scale 1, no padding) and its boxes come back in model-input pixels, which
``letterbox.to_source`` maps to source pixels exactly as the ONNX backend does.

Offline: Ultralytics probes DNS at import (``ONLINE``), pip-installs missing
packages (``AUTOINSTALL``) and may send usage events. :func:`configure_offline`
defaults ``YOLO_OFFLINE`` and ``YOLO_AUTOINSTALL`` so that none of that happens
(a value already in the environment wins). Ultralytics reads them once, at its
import, so they are set before the first import.

Security: a ``.pt`` file is a pickle; loading one runs code. Serve only models
you trust, or export them to ONNX (``framerelay model export``).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from framerelay.detections import Detections
from framerelay.errors import ModelError
from gpu_worker.detectors.base import ModelInput, UltralyticsDetectorSettings

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the Ultralytics extra: pip install 'framerelay[ultralytics]' "
    "torch==2.14.1 torchvision==0.29.1 (or export the model to ONNX elsewhere with "
    "'framerelay model export' and serve the .onnx file)"
)
OFFLINE_ENV: dict[str, str] = {"YOLO_OFFLINE": "true", "YOLO_AUTOINSTALL": "false"}
"""Environment defaults that keep Ultralytics off the network."""
DEFAULT_IMGSZ = 640
SERVED_TASKS = frozenset({"detect"})


def configure_offline(config_dir: Path | None = None) -> None:
    """Default the variables that keep Ultralytics offline; set before importing it.

    ``config_dir`` (``YOLO_CONFIG_DIR``) is where Ultralytics keeps its
    ``settings.json``; ``None`` leaves its default (``~/.config/Ultralytics``).
    Variables already set are left alone.
    """
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if config_dir is not None:
        os.environ.setdefault("YOLO_CONFIG_DIR", str(config_dir))


def import_ultralytics() -> ModuleType:
    """Import ``ultralytics`` offline, or raise :class:`ModelError` saying what to install.

    Ultralytics sets ``OMP_NUM_THREADS=1`` at import where it is unset (a
    training default); that is undone so child processes don't inherit it.
    """
    first = "ultralytics" not in sys.modules
    omp_before = os.environ.get("OMP_NUM_THREADS")
    if first:  # its settings are read once, at import
        configure_offline()
    try:
        module = importlib.import_module("ultralytics")
    except ImportError as exc:
        msg = f"the Ultralytics backend is not installed ({exc}); {INSTALL_HINT}"
        raise ModelError(msg) from exc
    except Exception as exc:  # e.g. torchvision built for another torch
        raise ModelError(f"Ultralytics failed to import: {exc!r}; {INSTALL_HINT}") from exc
    if first and omp_before is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    return module


def load_yolo(path: Path, task: str | None = None) -> Any:
    """An ``ultralytics.YOLO`` model from a local file; never downloads."""
    if not path.is_file():  # Ultralytics would try to download a missing name
        raise ModelError(f"model file not found: {path}")
    if path.suffix != ".pt":
        raise ModelError(
            f"{path}: the Ultralytics backend serves PyTorch '.pt' files; "
            "serve '.onnx' files with the onnx backend"
        )
    yolo_cls = import_ultralytics().YOLO
    try:
        return yolo_cls(str(path), task=task)
    except Exception as exc:  # torch/pickle/Ultralytics raise many unrelated types
        raise ModelError(
            f"cannot load {path} with Ultralytics: {exc!r}; is it an Ultralytics YOLO checkpoint?"
        ) from exc


def model_imgsz(yolo: Any) -> tuple[int, int]:
    """The (width, height) a checkpoint was trained at (``imgsz``), default 640."""
    raw: Any = getattr(yolo, "overrides", {}).get("imgsz") or DEFAULT_IMGSZ
    if isinstance(raw, int):
        return raw, raw
    if isinstance(raw, list | tuple) and len(raw) == 2:  # Ultralytics lists (h, w)
        return int(raw[1]), int(raw[0])
    raise ModelError(f"unreadable imgsz {raw!r} in the checkpoint")


def model_stride(yolo: Any) -> int:
    """The model's largest stride (32 for YOLOv8/11)."""
    stride: Any = getattr(yolo.model, "stride", None)
    return int(max(stride.tolist())) if stride is not None else 32


def class_names(yolo: Any) -> tuple[str, ...]:
    """``model.names`` (a dict ``{index: name}``) as a tuple in index order."""
    names: Any = yolo.names
    if isinstance(names, dict):
        return tuple(str(names[i]) for i in sorted(names))
    return tuple(str(n) for n in names)


def _select_device(wanted: str) -> str:
    """Resolve '' (auto), 'cpu', 'cuda:0', '0' ... to a torch device string."""
    torch_utils = importlib.import_module("ultralytics.utils.torch_utils")
    try:
        device: Any = torch_utils.select_device(wanted, verbose=False)
    except Exception as exc:  # ValueError for an absent GPU, RuntimeError, ...
        raise ModelError(f"device {wanted!r} is not usable: {exc}") from exc
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        return f"cuda:{index}"
    return str(device.type)


class UltralyticsDetector:
    """Runs an Ultralytics ``.pt`` detector; ``infer`` is blocking and serialised."""

    def __init__(self, settings: UltralyticsDetectorSettings) -> None:
        self.settings = settings
        self._yolo = load_yolo(settings.model)
        task = str(getattr(self._yolo, "task", ""))
        if task not in SERVED_TASKS:
            raise ModelError(
                f"{settings.model} is a {task!r} model; framerelay serves detection models "
                f"(tasks {sorted(SERVED_TASKS)})"
            )
        self.input_size: tuple[int, int] = model_imgsz(self._yolo)
        stride = model_stride(self._yolo)
        if any(side % stride for side in self.input_size):
            raise ModelError(
                f"{settings.model}: input size {self.input_size} is not a multiple of the "
                f"model stride {stride}"
            )
        self.class_names: tuple[str, ...] = class_names(self._yolo)
        self._device = _select_device(settings.device)
        self.providers: tuple[str, ...] = (f"torch:{self._device}",)
        self._lock = threading.Lock()  # an Ultralytics predictor is not thread-safe
        log.info(
            "loaded %s with Ultralytics on %s: input %dx%d, %d classes",
            settings.model,
            self._device,
            *self.input_size,
            len(self.class_names),
        )

    def metadata(self) -> dict[str, str]:
        """Facts from the checkpoint: Ultralytics version, date, task, imgsz, stride."""
        ckpt: Any = getattr(self._yolo, "ckpt", None) or {}
        facts = {
            "version": ckpt.get("version"),
            "date": ckpt.get("date"),
            "task": getattr(self._yolo, "task", None),
            "imgsz": getattr(self._yolo, "overrides", {}).get("imgsz"),
            "stride": model_stride(self._yolo),
        }
        return {k: str(v) for k, v in facts.items() if v is not None}

    def _check(self, batch: Sequence[ModelInput]) -> None:
        w, h = self.input_size
        for item in batch:
            img = item.image
            if img.dtype != np.uint8 or img.shape != (h, w, 3):
                raise ModelError(
                    f"input images must be uint8 {h}x{w}x3, got {img.dtype} {img.shape}"
                )

    def _predict(self, images: list[NDArray[np.uint8]]) -> list[Any]:
        w, h = self.input_size
        s = self.settings
        extra: dict[str, Any] = {"quantize": 16} if self._device.startswith("cuda") else {}
        with self._lock:
            results: list[Any] = self._yolo.predict(
                images,
                imgsz=(h, w),
                conf=s.confidence_threshold,
                iou=s.nms_iou,
                max_det=s.max_detections,
                device=self._device,
                verbose=False,
                **extra,
            )
        return results

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        if not batch:
            return []
        self._check(batch)
        out: list[Detections] = []
        step = self.settings.max_batch
        for start in range(0, len(batch), step):
            chunk = batch[start : start + step]
            results = self._predict([m.image for m in chunk])
            if len(results) != len(chunk):
                raise ModelError(f"Ultralytics returned {len(results)} results for {len(chunk)}")
            out.extend(_to_detections(r, m) for r, m in zip(results, chunk, strict=True))
        return out


def _to_detections(result: Any, item: ModelInput) -> Detections:
    """One Ultralytics ``Results`` -> ``Detections`` in source pixels."""
    boxes: Any = result.boxes
    if boxes is None or len(boxes) == 0:
        return Detections.empty()
    xyxy = np.asarray(boxes.xyxy.float().cpu().numpy(), dtype=np.float32)
    return Detections(
        xyxy=item.letterbox.to_source(xyxy),
        confidence=np.asarray(boxes.conf.float().cpu().numpy(), dtype=np.float32),
        class_id=np.asarray(boxes.cls.cpu().numpy(), dtype=np.int32),
    )
