"""The ONNX detector's entry in the artefact cache (:mod:`gpu_worker.artefact_cache`).

What a start builds from a model file, and what it is keyed by:

- on the CPU provider, ONNX Runtime's optimised model (``optimized_model_filepath`` at
  ``ORT_ENABLE_ALL``), loaded again with graph optimisations off: no ``onnx`` import,
  no graph rewrites, no dynamic-batch probe, no optimisation pass. ORT warns that such
  a model may hold CPU-specific layouts, so the key holds the CPU model and flags;
- on GPU providers, the prepared graph (batch axis, in-graph pre/post-processing),
  which the provider compiles; TensorRT's engine and timing caches go to
  ``<cache>/trt/<key>`` beside it (ORT writes them itself).

The key (:func:`build_facts`) is the model file's sha256, the providers, the ORT
version, the CPU fingerprint, the GPU's name (its type: engines are per compute
capability), the installed TensorRT's version when TensorRT is chosen, and every
setting that changes the built graph.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from gpu_worker.artefact_cache import ArtefactCache, artefact_key, cpu_fingerprint, file_sha256
from gpu_worker.detectors import ort_providers as op
from gpu_worker.detectors.base import OnnxDetectorSettings

log = logging.getLogger(__name__)
OPTIMIZED = "model.ort-optimized.onnx"
PREPARED = "model.prepared.onnx"
LOCK_TIMEOUT_S = 900.0
"""The longest a worker waits for another's TensorRT build of the same entry."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What the detector learnt while building, kept beside the artefact."""

    shape: op.ModelShape
    batched: bool
    format: str
    classes: tuple[str, ...]
    uint8: bool
    in_graph_post: bool

    def as_meta(self) -> dict[str, Any]:
        return {**asdict(self), "shape": asdict(self.shape), "classes": list(self.classes)}


def facts_of(meta: dict[str, Any]) -> Facts:
    return Facts(
        shape=op.ModelShape(**meta["shape"]),
        batched=bool(meta["batched"]),
        format=str(meta["format"]),
        classes=tuple(str(c) for c in meta["classes"]),
        uint8=bool(meta["uint8"]),
        in_graph_post=bool(meta["in_graph_post"]),
    )


def gpu_name() -> str:
    """The first visible GPU's name (the GPU type): NVML's word, else the driver's
    ``/proc`` entry (no nvidia-ml-py), else ``unknown``."""
    from gpu_worker.gpu_stats import read_gpus

    status = read_gpus()
    if status.gpus:
        return status.gpus[0].name
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Model:"):
                    return line.removeprefix("Model:").strip()
    return "unknown"


def tensorrt_version() -> str:
    """The installed TensorRT's version ('' when no pip package says): engines are
    valid for one TensorRT version only."""
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt_libs", "tensorrt-cu12-libs"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{dist} {metadata.version(dist)}"
    return ""


def build_facts(
    settings: OnnxDetectorSettings, chosen: Sequence[str], ort_version: str, digest: str
) -> dict[str, object]:
    on_gpu = op.on_gpu(chosen)
    return {
        "model_sha256": digest,
        "providers": list(chosen),
        "onnxruntime": ort_version,
        "cpu": cpu_fingerprint(),
        "gpu": gpu_name() if on_gpu else "",
        "tensorrt": tensorrt_version() if op.TENSORRT in chosen else "",
        "fp16": settings.fp16 and op.TENSORRT in chosen,
        "max_batch": settings.max_batch,
        "format": settings.format,
        "in_graph_prep": settings.in_graph_prep,
        "in_graph_post": settings.in_graph_post,
        "post": [settings.confidence_threshold, settings.nms_iou, settings.max_detections],
    }


class Store:
    """One detector's entry: its key, folder, and the cache holding it."""

    def __init__(self, cache: ArtefactCache, key: str) -> None:
        self.cache = cache
        self.key = key

    @property
    def folder(self) -> Path:
        return self.cache.entry(self.key)

    def lookup(self) -> dict[str, Any] | None:
        meta = self.cache.lookup(self.key)
        if meta is None or meta.get("kind") not in (OPTIMIZED, PREPARED):
            return None
        try:
            facts_of(meta)
        except (KeyError, TypeError, ValueError):
            log.warning("artefact cache entry %s has an unreadable meta; building again", self.key)
            return None
        return meta

    def read(self, name: str) -> bytes:
        return self.cache.read(self.key, name)

    def save(self, kind: str, model: bytes, facts: Facts) -> None:
        self.cache.store(self.key, {kind: model}, {"kind": kind, **facts.as_meta()})


def open_store(
    settings: OnnxDetectorSettings, chosen: Sequence[str], ort_version: str
) -> Store | None:
    """The detector's entry, or None without ``cache_dir``."""
    if settings.cache_dir is None:
        return None
    cache = ArtefactCache(settings.cache_dir / "models").prepare()
    facts = build_facts(settings, chosen, ort_version, file_sha256(settings.model))
    return Store(cache, artefact_key(facts))


def optimized_model(model: bytes, options: Any) -> bytes:
    """ONNX Runtime's optimised form of ``model`` for this CPU (``options`` are the
    detector's session options; only the output path is added)."""
    import onnxruntime as ort

    fd, tmp = tempfile.mkstemp(prefix="framerelay-ort-", suffix=".onnx")
    os.close(fd)
    try:
        options.optimized_model_filepath = tmp
        ort.InferenceSession(model, options, providers=[op.CPU])
        return Path(tmp).read_bytes()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
