"""The RunPod serverless handler: batches of job frames in, detections per frame out.

A serverless tier sends a job's frames to a RunPod *queue-based* serverless endpoint
(one the orchestrator manages, started as ``worker --serverless``, or one made by hand)
instead of over a tunnel (:mod:`ingest.serverless_link`). RunPod
runs the worker image's handler function on each job: it is called with
``{"id": <job id>, "input": {...}}`` and what it returns becomes the job's ``output``;
a returned dict with an ``"error"`` key marks the job ``FAILED`` with that error, and an
exception does the same with a traceback (RunPod docs, "Handler functions":
serverless/workers/handler-functions; the SDK's ``rp_job.run_job``). This handler never
raises for bad input: it returns one clear line in ``error``.

Input (the ingest has letterboxed and JPEG-encoded every frame exactly as for the
tunnel, :mod:`ingest.prepare`)::

    {"model": "yolox_nano",              # optional: the worker's default model
     "frames": [{"pts": 3003, "src_w": 1280, "src_h": 720, "scale": 0.325,
                 "jpeg_b64": "<base64 of the model-input JPEG>"}, ...]}

Output::

    {"model": "yolox_nano", "worker_id": "...", "class_names": [...],
     "results": [{"pts": 3003, "xyxy": [[x1, y1, x2, y2], ...], "confidence": [...],
                  "class_id": [...]}, {"pts": 3004, "error": "undecodable JPEG: ..."}],
     "timings": {"decode_ms": ..., "infer_ms": ...}}

Results are in the input's order, one per frame; boxes in source pixels; detections
below ``min_confidence`` are left out. Frames run through the detector in batches of at
most the worker's batch size. Limits: a ``/run`` body is at most 10 MB (RunPod docs,
"Operation reference": serverless/endpoints/operation-reference), so at most
:data:`MAX_FRAMES` frames of at most :data:`MAX_JPEG_BYTES` each; the client sizes its
batches below that. Detections are untracked (``tracker_id`` -1): frames of one task
may run on several workers at once, so no tracker sees them all.

Start (the image's command on a serverless endpoint; its entrypoint is ``framerelay``)::

    framerelay worker --serverless        # or: python -m gpu_worker.serverless

It reads the worker's settings (``FRAMERELAY_WORKER_...``: detector, model registry;
``--model`` and the other detector options too) and hands the handler to the RunPod
SDK (``pip install runpod``, optional: imported only here).
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from framerelay.detections import Detections
from framerelay.errors import CapacityError, ConfigError, FramerelayError, ProtocolError
from framerelay.geometry import Letterbox
from framerelay.model_registry import MODEL_NAME, load_registry
from framerelay.wire import MAX_SCALE, MAX_SIDE
from gpu_worker.detectors import Detector, ModelInput, load_detector
from gpu_worker.images import decode_jpeg_bgr
from gpu_worker.model_pool import ModelPool, ServedModel, default_model, detector_loader
from gpu_worker.settings import WorkerSettings
from gpu_worker.volume import SharedVolume

log = logging.getLogger(__name__)
MAX_RUN_BYTES = 10 * 1024 * 1024
"""RunPod's largest ``/run`` request body (operation reference: 10 MB)."""
MAX_FRAMES = 512
"""Frames in one job."""
MAX_JPEG_BYTES = 2 * 1024 * 1024
"""One frame's JPEG (a model input of a few hundred pixels a side is tens of KB)."""
_MAX_B64 = (MAX_JPEG_BYTES + 2) // 3 * 4
_MAX_ERROR = 300


class FrameIn(BaseModel):
    """One letterboxed model-input frame of a job (strict: the input is a peer's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    pts: int = Field(ge=-(2**63), lt=2**63)
    src_w: int = Field(gt=0, le=MAX_SIDE)
    src_h: int = Field(gt=0, le=MAX_SIDE)
    scale: float = Field(gt=0.0, le=MAX_SCALE)
    jpeg_b64: str = Field(min_length=4, max_length=_MAX_B64)


class JobInput(BaseModel):
    """A serverless job's ``input``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str | None = Field(None, pattern=MODEL_NAME)
    frames: list[FrameIn] = Field(min_length=1, max_length=MAX_FRAMES)
    min_confidence: float | None = Field(
        None, ge=0.0, le=1.0, description="Default: the worker's result_min_confidence."
    )


def _input_problem(exc: ValidationError) -> str:
    """One line naming the first bad field (never the value: it may be megabytes)."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "input"
    return f"bad input: {where}: {first['msg']} ({exc.error_count()} problem(s))"


def parse_job(job: object) -> JobInput:
    """The job's ``input``; :class:`ConfigError` with one line when it is not one."""
    if not isinstance(job, Mapping) or not isinstance(job.get("input"), Mapping):
        raise ConfigError('bad job: expected {"id": ..., "input": {"frames": [...]}}')
    try:
        return JobInput.model_validate(job["input"])
    except ValidationError as exc:
        raise ConfigError(_input_problem(exc)) from None


def _jpeg(frame: FrameIn) -> bytes:
    try:
        return base64.b64decode(frame.jpeg_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("jpeg_b64 is not base64") from None


def _letterbox(frame: FrameIn, size: tuple[int, int]) -> Letterbox:
    return Letterbox(frame.src_w, frame.src_h, size[0], size[1], frame.scale)


def _result(pts: int, det: Detections, min_confidence: float) -> dict[str, Any]:
    keep = np.flatnonzero(det.confidence >= min_confidence)
    kept = det[keep] if len(keep) < len(det) else det
    return {
        "pts": pts,
        "xyxy": [[round(v, 2) for v in box] for box in kept.xyxy.tolist()],
        "confidence": [round(c, 4) for c in kept.confidence.tolist()],
        "class_id": kept.class_id.tolist(),
    }


class ServerlessHandler:
    """RunPod's handler function for this worker: ``handler(job) -> output``. Thread-safe
    (a test's contract server calls it from several threads, like several workers)."""

    def __init__(
        self, models: ModelPool, *, worker_id: str, max_batch: int, min_confidence: float
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.models = models
        self.worker_id = worker_id
        self.max_batch = max_batch
        self.min_confidence = min_confidence
        self.jobs = 0
        self._lock = threading.Lock()

    def __call__(self, job: Mapping[str, Any]) -> dict[str, Any]:
        try:
            spec = parse_job(job)
            model = self._acquire(spec.model)
        except FramerelayError as exc:
            return {"error": str(exc)[:_MAX_ERROR]}
        try:
            return self._run(spec, model)
        except FramerelayError as exc:
            return {"error": str(exc)[:_MAX_ERROR]}
        except Exception as exc:
            log.exception("serverless job failed")
            return {"error": f"inference failed: {type(exc).__name__}: {exc}"[:_MAX_ERROR]}
        finally:
            with self._lock:
                self.models.release(model)

    def _acquire(self, name: str | None) -> ServedModel:
        with self._lock:
            try:
                return self.models.acquire(name)
            except (ConfigError, CapacityError) as exc:
                raise ConfigError(f"model: {exc}") from None

    def _run(self, spec: JobInput, model: ServedModel) -> dict[str, Any]:
        detector = model.detector()  # loads a registry model on first use (blocking)
        t0 = time.perf_counter()
        results: list[dict[str, Any] | None] = [None] * len(spec.frames)
        good: list[tuple[int, ModelInput]] = []
        for i, frame in enumerate(spec.frames):
            try:
                w, h = detector.input_size
                image = decode_jpeg_bgr(_jpeg(frame), w, h)
                good.append((i, ModelInput(image, _letterbox(frame, (w, h)))))
            except (ProtocolError, ValueError) as exc:
                results[i] = {"pts": frame.pts, "error": str(exc)[:_MAX_ERROR]}
        t1 = time.perf_counter()
        floor = self.min_confidence if spec.min_confidence is None else spec.min_confidence
        for start in range(0, len(good), self.max_batch):
            chunk = good[start : start + self.max_batch]
            found = detector.infer([inp for _, inp in chunk])
            for (i, _), det in zip(chunk, found, strict=True):
                results[i] = _result(spec.frames[i].pts, det, floor)
        with self._lock:
            self.jobs += 1
        return {
            "model": model.name, "worker_id": self.worker_id,
            "class_names": list(detector.class_names), "results": results,
            "timings": {"decode_ms": round((t1 - t0) * 1000, 3),
                        "infer_ms": round((time.perf_counter() - t1) * 1000, 3)},
        }  # fmt: skip


def build_handler(settings: WorkerSettings, detector: Detector | None = None) -> ServerlessHandler:
    """The handler of a worker with ``settings`` (its default detector loaded now: RunPod
    asks to load models outside the handler, before the first job)."""
    from gpu_worker.server import batch_limit

    volume = SharedVolume.from_settings(settings)  # its files only as signed
    detector = detector or volume.load_detector(settings.detector, load_detector)
    registry = load_registry(settings.model_registry, volume.read_bytes)
    pool = ModelPool(
        registry,
        default_model(settings.default_model, detector, registry),
        detector_loader(settings.detector, volume),
        budget_mb=settings.vram_budget_mb,
    )
    return ServerlessHandler(
        pool,
        worker_id=settings.worker_id,
        max_batch=batch_limit(settings, detector),
        min_confidence=settings.result_min_confidence,
    )


def serve_runpod(settings: WorkerSettings) -> int:
    """Serve RunPod jobs with the RunPod SDK (``framerelay worker --serverless``); an exit
    status (2: the SDK is missing or the settings are wrong, said in one line)."""
    try:
        import runpod  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        log.error("the RunPod SDK is not installed: pip install runpod (serverless mode only)")
        return 2
    try:
        handler = build_handler(settings)
    except FramerelayError as exc:
        log.error("cannot start: %s", str(exc).splitlines()[0][:_MAX_ERROR])
        return 2
    log.info("serving RunPod serverless jobs (model %s, batches of %d)",
             handler.models.default.name, handler.max_batch)  # fmt: skip
    runpod.serverless.start({"handler": handler})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpu_worker.serverless``: the worker's settings from the environment."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = WorkerSettings()
    except ValidationError as exc:
        log.error("cannot start: %s", str(exc).splitlines()[0][:_MAX_ERROR])
        return 2
    return serve_runpod(settings)


if __name__ == "__main__":
    raise SystemExit(main())
