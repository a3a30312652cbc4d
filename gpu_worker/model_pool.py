"""The models one worker hosts, within its GPU memory budget.

A stream names its model in OPEN (none: the worker's default model, the one
its ``detector`` setting loads at start, which stays loaded). :meth:`ModelPool.acquire`
looks the name up in the model registry (:mod:`framerelay.model_registry`) and
reserves its ``vram_mb``; when the budget (``vram_budget_mb``; 0: no budget)
would be exceeded it evicts the least recently used models that no open stream
uses, and refuses the stream (:class:`~framerelay.errors.CapacityError`) when
that is not enough. A model is never evicted while a stream uses it.

Loading is lazy: the first batch with a frame of the model loads it on the
inference thread (:meth:`ServedModel.detector`), the thread that owns every
detector, so the event loop never waits for it; that first batch takes the
load time (a TensorRT engine build on a first start can take longer than
``inference_stall_s``: raise that setting, or cache engines on a volume).
A model that fails to load fails its frames (``inference_error``, with the
reason) and is retried only after its streams are gone. A model file on the shared
volume loads only as its signed bytes (:mod:`gpu_worker.volume`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from framerelay import wire
from framerelay.errors import CapacityError, ModelError
from framerelay.model_registry import BUILTIN, ModelEntry, ModelRegistry
from gpu_worker.detectors import (
    Detector,
    DetectorSettings,
    OnnxDetectorSettings,
    settings_for_model,
)
from gpu_worker.volume import SharedVolume

log = logging.getLogger(__name__)
Loader = Callable[[ModelEntry], Detector]
HELLO_MODELS_BYTES = 8 * 1024
"""HELLO's ``models`` take at most this much of its header (the wire allows 16 KiB in all;
the default model's class names are there twice)."""


@dataclass(slots=True, eq=False)
class ServedModel:
    """One model of the pool: its entry, its detector once loaded, who uses it."""

    entry: ModelEntry
    loader: Loader
    loaded: Detector | None = None
    pinned: bool = False
    streams: int = 0
    last_used: float = field(default_factory=time.monotonic)
    load_s: float = 0.0
    error: ModelError | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.entry.name

    def detector(self) -> Detector:
        """The loaded detector, loading it first if needed (blocking: the inference thread)."""
        self.last_used = time.monotonic()
        if self.loaded is not None:
            return self.loaded
        with self._lock:
            if self.error is not None:
                raise self.error
            if self.loaded is None:
                self.loaded = self._load()
        return self.loaded

    def _load(self) -> Detector:
        t0 = time.perf_counter()
        try:
            detector = self.loader(self.entry)
            _check_shape(self.entry, detector)
        except Exception as exc:  # any failure to load: said once, kept for its frames
            said = str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
            self.error = ModelError(f"model {self.name} failed to load: {said[:300]}")
            raise self.error from None
        self.load_s = time.perf_counter() - t0
        log.info("model %s loaded in %.2f s", self.name, self.load_s)
        return detector

    def info(self) -> dict[str, object]:
        return {**self.entry.info(), "loaded": self.loaded is not None, "pinned": self.pinned,
                "streams": self.streams, "load_s": round(self.load_s, 3),
                "error": None if self.error is None else str(self.error)}  # fmt: skip


def _check_shape(entry: ModelEntry, detector: Detector) -> None:
    size = (entry.input_w, entry.input_h)
    if detector.input_size != size:
        raise ModelError(f"its input is {detector.input_size}, the registry says {size}")
    if len(detector.class_names) != len(entry.classes):
        raise ModelError(
            f"it has {len(detector.class_names)} classes, the registry lists {len(entry.classes)}"
        )


class ModelPool:
    """Models by name within a budget of GPU memory (MiB); see the module doc."""

    def __init__(
        self,
        registry: ModelRegistry,
        default: ServedModel,
        loader: Loader,
        *,
        budget_mb: float = 0.0,
    ) -> None:
        self.registry = registry
        self.loader = loader
        self.budget_mb = budget_mb
        self.default = default
        default.pinned = True
        self.models: dict[str, ServedModel] = {default.name: default}
        self.evictions = 0

    @property
    def input_size(self) -> tuple[int, int]:
        return self.default.entry.input_w, self.default.entry.input_h

    @property
    def used_mb(self) -> float:
        return sum(m.entry.vram_mb for m in self.models.values())

    @property
    def free_mb(self) -> float | None:
        """What is left of the budget; None without one."""
        return None if self.budget_mb <= 0 else max(self.budget_mb - self.used_mb, 0.0)

    def acquire(self, name: str | None) -> ServedModel:
        """The model a new stream uses (counted until :meth:`release`). Raises
        ConfigError (unknown name), ModelError (another input size) or CapacityError."""
        model = self.models.get(name or self.default.name)
        if model is None:
            assert name is not None  # noqa: S101 - the default is always there
            model = self._add(self.registry.get(name))
        model.streams += 1
        model.last_used = time.monotonic()
        return model

    def release(self, model: ServedModel) -> None:
        """A stream of ``model`` ended."""
        model.streams = max(model.streams - 1, 0)
        model.last_used = time.monotonic()
        if model.streams == 0 and model.error is not None and not model.pinned:
            self.models.pop(model.name, None)  # a failed load is retried afresh

    def _add(self, entry: ModelEntry) -> ServedModel:
        size = (entry.input_w, entry.input_h)
        if size != self.input_size:
            raise ModelError(
                f"model {entry.name} takes {size[0]}x{size[1]} images; this worker's "
                f"tunnels carry {self.input_size[0]}x{self.input_size[1]}"
            )
        self._make_room(entry)
        model = ServedModel(entry, self.loader)
        self.models[entry.name] = model
        return model

    def _make_room(self, entry: ModelEntry) -> None:
        if self.budget_mb <= 0:
            return
        while self.used_mb + entry.vram_mb > self.budget_mb:
            idle = [m for m in self.models.values() if m.streams == 0 and not m.pinned]
            if not idle:
                raise CapacityError(
                    f"model {entry.name} needs {entry.vram_mb:g} MiB; {self.free_mb:g} of "
                    f"{self.budget_mb:g} MiB are free and every other model has streams"
                )
            victim = min(idle, key=lambda m: m.last_used)
            del self.models[victim.name]
            self.evictions += 1
            log.info("evicted model %s (least recently used) for %s", victim.name, entry.name)

    def hello_models(self, max_bytes: int = HELLO_MODELS_BYTES) -> list[wire.ModelInfo]:
        """The models a stream may name here (HELLO): those of the registry whose input
        size this worker's tunnels carry, the default first, as many as fit in
        ``max_bytes`` of HELLO's header (a model left out still serves, but an ingest
        names its classes by number)."""
        size = self.input_size
        entries = [self.default.entry] + [
            e for e in self.registry.entries.values()
            if e.name != self.default.name and (e.input_w, e.input_h) == size
        ]  # fmt: skip
        out: list[wire.ModelInfo] = []
        used = 0
        for e in entries[: wire.MAX_MODELS]:
            info = wire.ModelInfo(name=e.name, input_w=e.input_w, input_h=e.input_h,
                                  class_names=list(e.classes))  # fmt: skip
            used += len(msgspec.json.encode(info)) + 1
            if used > max_bytes:
                log.warning("HELLO lists %d of %d models (its header is bounded)",
                            len(out), len(entries))  # fmt: skip
                break
            out.append(info)
        return out

    def info(self) -> dict[str, object]:
        """``/info``'s view: every model held, the budget and what is free."""
        return {
            "models": [m.info() for m in self.models.values()],
            "vram_budget_mb": self.budget_mb,
            "vram_used_mb": self.used_mb,
            "vram_free_mb": self.free_mb,
            "model_evictions": self.evictions,
        }


def default_model(name: str, detector: Detector, registry: ModelRegistry) -> ServedModel:
    """The worker's own detector (loaded at start) as the model ``name``: the registry's
    entry of that name (or the built-in one) for its memory need and canary, with the
    detector's real input size and classes."""
    base = registry.entries.get(name, BUILTIN)
    w, h = detector.input_size
    update = {"name": name, "input_w": w, "input_h": h, "classes": tuple(detector.class_names)}
    return ServedModel(base.model_copy(update=update), _never, loaded=detector)


def _never(entry: ModelEntry) -> Detector:
    raise ModelError(f"model {entry.name} is the worker's own and is never reloaded")


def detector_loader(settings: DetectorSettings, volume: SharedVolume | None = None) -> Loader:
    """Loads a registry entry with the worker's detector settings (threads, providers,
    caches) and the entry's file, format and classes, then prepares it; through
    ``volume`` (files on it only as signed) when given."""
    gate = volume or SharedVolume(None, None)

    def load(entry: ModelEntry) -> Detector:
        if isinstance(settings, OnnxDetectorSettings) and entry.file.suffix == ".onnx":
            own = {"model": entry.file, "class_names": entry.classes, "format": entry.format}
            chosen: DetectorSettings = settings.model_copy(update=own)
        else:
            chosen = settings_for_model(entry.file)
        detector = gate.load_detector(chosen)
        prepare = getattr(detector, "prepare", None)
        if callable(prepare):
            prepare()
        return detector

    return load
