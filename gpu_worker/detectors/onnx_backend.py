"""ONNX Runtime backend: YOLOX and Ultralytics YOLOv8/YOLO11 exports.

Providers are tried TensorRT -> CUDA -> CPU (``providers='auto'``); what the
session really uses is read back from ``session.get_providers()``, because
onnxruntime-gpu lists CUDA as available even on machines without a GPU.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from framerelay.coco import COCO_CLASSES
from framerelay.detections import Detections
from framerelay.errors import ModelError
from gpu_worker.detectors.base import ModelInput, OnnxDetectorSettings
from gpu_worker.detectors.batch_axis import dynamic_batch_model
from gpu_worker.detectors.postprocess import (
    PostprocessSettings,
    decode_ultralytics,
    decode_yolox,
    select,
    yolox_grid,
)

log = logging.getLogger(__name__)

_PROVIDER_ORDER = {
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "cpu": ["CPUExecutionProvider"],
}
_PROVIDER_ORDER["auto"] = _PROVIDER_ORDER["tensorrt"]


def choose_providers(wanted: str) -> list[str]:
    """The preferred providers that this onnxruntime build offers, in order."""
    available = set(ort.get_available_providers())
    chosen = [p for p in _PROVIDER_ORDER[wanted] if p in available]
    return chosen or ["CPUExecutionProvider"]


class OnnxDetector:
    """Runs an ONNX detector; ``infer`` is blocking and thread-safe per call."""

    def __init__(self, settings: OnnxDetectorSettings) -> None:
        self.settings = settings
        self._post = PostprocessSettings(
            settings.confidence_threshold, settings.nms_iou, settings.max_detections
        )
        model_bytes = settings.model.read_bytes()
        self._session = self._open(model_bytes, settings)
        self._batched = self._batch_axis_is_dynamic()
        if not self._batched and settings.max_batch > 1:
            self._session = self._try_dynamic(model_bytes, settings)
        inp = self._session.get_inputs()[0]
        self._input_name: str = inp.name
        h, w = inp.shape[2], inp.shape[3]
        if not (isinstance(h, int) and isinstance(w, int)):
            raise ModelError(f"{settings.model}: input {inp.shape} needs a fixed height and width")
        self.input_size: tuple[int, int] = (w, h)
        meta = self._session.get_modelmeta().custom_metadata_map
        self.format = self._detect_format(settings.format, meta)
        self.class_names = self._class_names(settings, meta)
        self.providers: tuple[str, ...] = tuple(self._session.get_providers())
        self._grid = yolox_grid(w, h) if self.format == "yolox" else None

    @staticmethod
    def _open(model: bytes, settings: OnnxDetectorSettings) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = settings.threads
        if not settings.spin:
            # Busy-waiting threads steal the CPU that decode and encode need when
            # they share cores with the inference (CPU workers, the demo).
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            return ort.InferenceSession(model, opts, providers=choose_providers(settings.providers))
        except Exception as exc:  # onnxruntime raises several unrelated types
            raise ModelError(f"cannot load {settings.model} with onnxruntime: {exc}") from exc

    def _batch_axis_is_dynamic(self) -> bool:
        return not isinstance(self._session.get_inputs()[0].shape[0], int)

    def _try_dynamic(self, model: bytes, settings: OnnxDetectorSettings) -> ort.InferenceSession:
        patched = dynamic_batch_model(model)
        if patched is None:
            log.info("model batch axis is fixed; running one image per inference")
            return self._session
        try:
            session = self._open(patched, settings)
        except ModelError as exc:
            log.warning("dynamic-batch rewrite did not load (%s); one image per run", exc)
            return self._session
        if not self._same_outputs(session):
            log.warning("dynamic-batch rewrite changed the outputs; one image per run")
            return self._session
        self._batched = True
        return session

    def _same_outputs(self, batched: ort.InferenceSession) -> bool:
        inp = self._session.get_inputs()[0]
        shape = [2, *(d if isinstance(d, int) else 1 for d in inp.shape[1:])]
        probe = np.random.default_rng(0).uniform(0, 255, shape).astype(np.float32)
        one = [self._session.run(None, {inp.name: p[None]})[0] for p in probe]
        try:
            two = batched.run(None, {inp.name: probe})[0]
        except Exception:
            return False
        return bool(np.allclose(np.concatenate(one), two, rtol=1e-3, atol=1e-3))

    @staticmethod
    def _detect_format(wanted: str, meta: dict[str, str]) -> str:
        if wanted != "auto":
            return wanted
        return "ultralytics" if "names" in meta else "yolox"

    @staticmethod
    def _class_names(settings: OnnxDetectorSettings, meta: dict[str, str]) -> tuple[str, ...]:
        if settings.class_names:
            return settings.class_names
        if "names" in meta:  # Ultralytics writes a dict literal {0: 'person', ...}
            try:
                names = ast.literal_eval(meta["names"])
                return tuple(str(names[i]) for i in sorted(names))
            except (ValueError, SyntaxError, TypeError, KeyError):
                log.warning("unreadable 'names' metadata in the model; using COCO names")
        return COCO_CLASSES

    def _to_tensor(self, batch: Sequence[ModelInput]) -> NDArray[np.float32]:
        w, h = self.input_size
        images = np.stack([m.image for m in batch])
        if images.shape[1:] != (h, w, 3):
            raise ModelError(f"input images must be {h}x{w}x3, got {images.shape[1:]}")
        if self.format == "ultralytics":  # RGB, 0..1
            return np.ascontiguousarray(
                images[..., ::-1].transpose(0, 3, 1, 2), dtype=np.float32
            ) * np.float32(1 / 255)
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)

    def _run(self, tensor: NDArray[np.float32]) -> NDArray[np.float32]:
        if self._batched:
            out: Any = self._session.run(None, {self._input_name: tensor})[0]
            return np.asarray(out, dtype=np.float32)
        outs = [self._session.run(None, {self._input_name: t[None]})[0] for t in tensor]
        return np.concatenate(outs).astype(np.float32, copy=False)

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        if not batch:
            return []
        results: list[Detections] = []
        step = self.settings.max_batch
        for start in range(0, len(batch), step):
            chunk = batch[start : start + step]
            raw = self._run(self._to_tensor(chunk))
            results.extend(self._decode(raw[i], m) for i, m in enumerate(chunk))
        return results

    def _decode(self, raw: NDArray[np.float32], item: ModelInput) -> Detections:
        if self._grid is not None:
            xyxy, score, cls = decode_yolox(raw, self._grid)
        else:
            xyxy, score, cls = decode_ultralytics(raw)
        return select(xyxy, score, cls, item.letterbox, self._post)
