"""ONNX Runtime backend: YOLOX and Ultralytics YOLOv8/YOLO11 exports.

Providers are tried TensorRT -> CUDA -> CPU (``providers='auto'``), each with its
options (:mod:`~gpu_worker.detectors.ort_providers`: TensorRT FP16, engine and
timing caches, a dynamic-batch profile); what the session really uses is read
back from ``session.get_providers()``, because onnxruntime-gpu lists CUDA as
available even on machines without a GPU. The model is first opened on the CPU
to read its input and make its batch axis dynamic, so TensorRT builds one engine,
for the final model only. On a GPU provider runs go through IO binding
(:mod:`~gpu_worker.detectors.io_binding`) unless ``io_binding='off'``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from framerelay.coco import COCO_CLASSES
from framerelay.detections import Detections
from framerelay.errors import ModelError
from framerelay.geometry import Letterbox
from gpu_worker.artefact_cache import build_lock
from gpu_worker.detectors import build_cache as bc
from gpu_worker.detectors import ort_providers as op
from gpu_worker.detectors.base import Acceleration, ModelInput, OnnxDetectorSettings
from gpu_worker.detectors.batch_axis import dynamic_batch_model
from gpu_worker.detectors.buckets import bucket_for, bucket_sizes
from gpu_worker.detectors.graph_edit import Format as GraphFormat
from gpu_worker.detectors.io_binding import BoundRunner
from gpu_worker.detectors.postprocess import (
    PostprocessSettings,
    decode_ultralytics,
    decode_yolox,
    select,
    yolox_grid,
)

log = logging.getLogger(__name__)
_FULL = Letterbox(1, 1, 1, 1, 1.0)  # the warm-up's blank images: nothing to map back


def choose_providers(wanted: str) -> list[str]:
    """The preferred providers that this onnxruntime build offers, in order."""
    return op.choose_providers(wanted, ort.get_available_providers())


class OnnxDetector:
    """Runs an ONNX detector; ``infer`` is blocking and thread-safe per call."""

    def __init__(self, settings: OnnxDetectorSettings) -> None:
        self.settings = settings
        self._post = PostprocessSettings(
            settings.confidence_threshold, settings.nms_iou, settings.max_detections
        )
        chosen = choose_providers(settings.providers)
        started = time.perf_counter()
        store = bc.open_store(settings, chosen, ort.__version__)
        meta = store.lookup() if store is not None else None
        cached = self._try_cache(store, meta, settings) if store and meta else None
        if cached is not None:
            shape, trt = cached
        else:
            meta = None
            model_bytes, shape = self._prepare(settings)
            self._session, trt = self._accelerate(model_bytes, settings, shape, store)
            if store is not None:
                self._store(store, model_bytes, shape, chosen)
        took = time.perf_counter() - started
        if store is not None:
            what = "found in" if meta is not None else "built and stored in"
            log.info("model %s %s the artefact cache %s in %.2f s",
                     settings.model.name, what, store.folder, took)  # fmt: skip
        self.providers: tuple[str, ...] = tuple(self._session.get_providers())
        self._runner = self._bound_runner(settings)
        self._grid = yolox_grid(shape.width, shape.height) if self.format == "yolox" else None
        use_buckets = self._batched and self._wants(settings.batch_buckets, settings)
        self._buckets: tuple[int, ...] = bucket_sizes(settings.max_batch) if use_buckets else ()
        self.acceleration = Acceleration(
            fp16=settings.fp16 and op.TENSORRT in self.providers,
            io_binding=self._runner is not None,
            engine_cache_dir=trt if op.TENSORRT in self.providers else None,
            in_graph_prep=self._uint8,
            in_graph_post=self._in_graph_post,
            batch_buckets=self._buckets,
            artefact_cache=None if store is None else "hit" if meta is not None else "built",
            artefact_key=None if store is None else store.key,
        )
        self._pad = np.zeros((shape.height, shape.width, 3), np.uint8)

    def _prepare(self, settings: OnnxDetectorSettings) -> tuple[bytes, op.ModelShape]:
        """The model as it will run (batch axis, in-graph pre/post-processing), built from
        the file; sets the facts the detector needs (format, classes, input handling)."""
        # onnx (the graph rewrites) is imported here only: a start from the cache skips it
        from gpu_worker.detectors.graph_post import with_nms
        from gpu_worker.detectors.graph_prep import with_uint8_input

        model_bytes = settings.model.read_bytes()
        self._session = self._open(model_bytes, settings, [op.CPU])
        self._batched = self._batch_axis_is_dynamic()
        if not self._batched and settings.max_batch > 1:
            model_bytes, self._session = self._try_dynamic(model_bytes, settings)
        shape = self._model_shape()
        self.input_size: tuple[int, int] = (shape.width, shape.height)
        self._input_name = shape.input_name
        meta = self._session.get_modelmeta().custom_metadata_map
        self.format = self._detect_format(settings.format, meta)
        self.class_names = self._class_names(settings, meta)
        fmt: GraphFormat = "ultralytics" if self.format == "ultralytics" else "yolox"
        self._uint8 = self._wants(settings.in_graph_prep, settings)
        if self._uint8:
            model_bytes = with_uint8_input(model_bytes, fmt)
            shape = dataclasses.replace(shape, channels_last=True)
        self._in_graph_post = self._wants(settings.in_graph_post, settings)
        if self._in_graph_post:
            model_bytes = with_nms(model_bytes, fmt, (shape.width, shape.height), self._post)
        return model_bytes, shape

    def _store(
        self, store: bc.Store, model: bytes, shape: op.ModelShape, chosen: list[str]
    ) -> None:
        """Keep what this start built: ORT's optimised model on the CPU, else the prepared
        graph (GPU providers compile it; TensorRT keeps its engines beside it)."""
        facts = bc.Facts(shape, self._batched, self.format, self.class_names, self._uint8,
                         self._in_graph_post)  # fmt: skip
        try:
            if chosen == [op.CPU]:
                store.save(bc.OPTIMIZED, bc.optimized_model(model, self._options(self.settings)),
                           facts)  # fmt: skip
            else:
                store.save(bc.PREPARED, model, facts)
        except OSError as exc:  # a full or read-only volume: serve anyway, build next time
            log.warning("could not store the built model in %s: %s", store.folder, exc)

    def _try_cache(
        self, store: bc.Store, meta: dict[str, Any], settings: OnnxDetectorSettings
    ) -> tuple[op.ModelShape, Path | None] | None:
        """The detector from its cached artefact, or None (built again) when the artefact
        is missing or does not load: a damaged cache costs a build, never the start."""
        try:
            return self._from_cache(store, meta, settings)
        except (OSError, ModelError) as exc:
            log.warning("artefact cache entry %s did not load (%s); building again",
                        store.key, str(exc).splitlines()[0][:200])  # fmt: skip
            return None

    def _from_cache(
        self, store: bc.Store, meta: dict[str, Any], settings: OnnxDetectorSettings
    ) -> tuple[op.ModelShape, Path | None]:
        facts = bc.facts_of(meta)
        shape = facts.shape
        self._batched, self.format, self.class_names = facts.batched, facts.format, facts.classes
        self._uint8, self._in_graph_post = facts.uint8, facts.in_graph_post
        self.input_size = (shape.width, shape.height)
        self._input_name = shape.input_name
        if settings.class_names:
            self.class_names = settings.class_names
        model = store.read(str(meta["kind"]))
        if meta["kind"] == bc.OPTIMIZED:  # already optimised for this CPU: load as it is
            self._session = self._open(model, settings, [op.CPU], optimize=False)
            return shape, None
        self._session, trt = self._accelerate(model, settings, shape, store)
        return shape, trt

    def _model_shape(self) -> op.ModelShape:
        inp = self._session.get_inputs()[0]
        if len(inp.shape) != 4:
            raise ModelError(f"{self.settings.model}: input {inp.shape} is not NCHW")
        c, h, w = inp.shape[1:]
        if not (isinstance(c, int) and isinstance(h, int) and isinstance(w, int)):
            raise ModelError(
                f"{self.settings.model}: input {inp.shape} needs a fixed height and width"
            )
        return op.ModelShape(inp.name, c, h, w, self._batched)

    @staticmethod
    def _wants(mode: str, settings: OnnxDetectorSettings) -> bool:
        """A graph rewrite (pre- or post-processing): on, off, or (auto) when a GPU
        provider is chosen."""
        if mode == "auto":
            return op.on_gpu(choose_providers(settings.providers))
        return mode == "on"

    def _accelerate(
        self, model: bytes, settings: OnnxDetectorSettings, shape: op.ModelShape,
        store: bc.Store | None,
    ) -> tuple[ort.InferenceSession, Path | None]:  # fmt: skip
        """The session on the chosen providers (the CPU one when only the CPU is there and
        the model was not rewritten). TensorRT's engines go to the engine cache directory,
        with an artefact cache to its keyed subdirectory (``<engine cache>/<key>``); a
        build there holds the directory's lock, so a second worker starting at once waits
        and then reads the engines."""
        chosen = choose_providers(settings.providers)
        if chosen == [op.CPU]:
            if self._uint8 or self._in_graph_post:
                return self._open(model, settings, [op.CPU]), None
            return self._session, None
        cache: Path | None = None
        if op.TENSORRT in chosen:
            path = settings.engine_cache_path()
            if store is not None:  # engines are valid for one model, GPU type, version
                path = path / store.key
            cache = op.prepare_cache_dir(path)
        options = op.GpuOptions(settings.fp16, cache, settings.max_batch)
        with build_lock(cache, bc.LOCK_TIMEOUT_S) if cache else contextlib.nullcontext():
            session = self._open(model, settings, op.build_providers(chosen, options, shape))
            if cache is not None:  # TensorRT may build at the first run: do it while locked
                self._first_run(session, shape)
        return session, cache

    @staticmethod
    def _first_run(session: ort.InferenceSession, shape: op.ModelShape) -> None:
        """One run of a blank image, so every engine exists (and is in the cache) before
        the build lock is let go."""
        inp = session.get_inputs()[0]
        dtype = {"tensor(uint8)": np.uint8, "tensor(float16)": np.float16}.get(inp.type)
        dims = (1, shape.height, shape.width, shape.channels) if shape.channels_last else (
            1, shape.channels, shape.height, shape.width)  # fmt: skip
        session.run(None, {inp.name: np.zeros(dims, dtype or np.float32)})

    def _bound_runner(self, settings: OnnxDetectorSettings) -> BoundRunner | None:
        gpu = op.on_gpu(self.providers)
        if settings.io_binding == "off" or (settings.io_binding == "auto" and not gpu):
            return None
        return BoundRunner(self._session, "cuda" if gpu else "cpu")

    @classmethod
    def _open(
        cls, model: bytes, settings: OnnxDetectorSettings, providers: Sequence[Any],
        *, optimize: bool = True,
    ) -> ort.InferenceSession:  # fmt: skip
        opts = cls._options(settings)
        if not optimize:  # an optimised model from the artefact cache
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(model, opts, providers=list(providers))
        except Exception as exc:  # onnxruntime raises several unrelated types
            raise ModelError(f"cannot load {settings.model} with onnxruntime: {exc}") from exc

    @staticmethod
    def _options(settings: OnnxDetectorSettings) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = settings.threads
        if not settings.spin:
            # Busy-waiting threads steal the CPU that decode and encode need when
            # they share cores with the inference (CPU workers, the demo).
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return opts

    def _batch_axis_is_dynamic(self) -> bool:
        return not isinstance(self._session.get_inputs()[0].shape[0], int)

    def _try_dynamic(
        self, model: bytes, settings: OnnxDetectorSettings
    ) -> tuple[bytes, ort.InferenceSession]:
        """The batchable rewrite and its CPU session, or the model as it is."""
        patched = dynamic_batch_model(model)
        if patched is None:
            log.info("model batch axis is fixed; running one image per inference")
            return model, self._session
        try:
            session = self._open(patched, settings, [op.CPU])
        except ModelError as exc:
            log.warning("dynamic-batch rewrite did not load (%s); one image per run", exc)
            return model, self._session
        if not self._same_outputs(session):
            log.warning("dynamic-batch rewrite changed the outputs; one image per run")
            return model, self._session
        self._batched = True
        return patched, session

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

    def prepare(self) -> None:
        """Run each bucket's batch size once, so serving never prepares a new shape.

        Call it on the thread that will run inference (the worker does, on its inference
        thread): the CUDA provider keeps per-thread state (cuDNN and cuBLAS handles)."""
        if not self._buckets:
            return
        started = time.perf_counter()
        for size in self._buckets:
            self._infer_chunk([ModelInput(self._pad, _FULL)] * size)
        sizes = ",".join(map(str, self._buckets))
        took = time.perf_counter() - started
        log.info("batch sizes %s prepared in %.1f s (first runs of each shape)", sizes, took)

    def _to_tensor(self, batch: Sequence[ModelInput], size: int = 0) -> NDArray[Any]:
        """The model's input: uint8 NHWC BGR as decoded (pre-processing in the graph), or
        the float NCHW tensor numpy makes of it; padded with blank images up to ``size``."""
        w, h = self.input_size
        pad = [self._pad] * (size - len(batch)) if size > len(batch) else []
        images = np.stack([m.image for m in batch] + pad)
        if images.shape[1:] != (h, w, 3):
            raise ModelError(f"input images must be {h}x{w}x3, got {images.shape[1:]}")
        if self._uint8:
            return images
        if self.format == "ultralytics":  # RGB, 0..1
            return np.ascontiguousarray(
                images[..., ::-1].transpose(0, 3, 1, 2), dtype=np.float32
            ) * np.float32(1 / 255)
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)

    def _run(self, tensor: NDArray[Any]) -> NDArray[np.float32]:
        if self._batched:
            return self._run_once(tensor)
        outs = [self._run_once(t[None]).copy() for t in tensor]  # pinned: reused
        return np.concatenate(outs).astype(np.float32, copy=False)

    def _run_once(self, tensor: NDArray[Any]) -> NDArray[np.float32]:
        if self._runner is not None:
            return self._runner.run(tensor)
        out: Any = self._session.run(None, {self._input_name: tensor})[0]
        return np.asarray(out, dtype=np.float32)

    def _run_post(self, tensor: NDArray[Any]) -> list[NDArray[Any]]:
        """The in-graph post-processing's outputs (graph_post.OUTPUTS) for the batch."""
        if self._batched:
            return self._run_all(tensor)
        parts = [self._run_all(t[None]) for t in tensor]  # one image per run
        for i, part in enumerate(parts):
            part[0] = np.full_like(part[0], i)
        return [np.concatenate([p[k] for p in parts]) for k in range(4)]

    def _run_all(self, tensor: NDArray[Any]) -> list[NDArray[Any]]:
        if self._runner is not None:
            return self._runner.run_all(tensor)
        return [np.asarray(o) for o in self._session.run(None, {self._input_name: tensor})]

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        if not batch:
            return []
        results: list[Detections] = []
        step = self.settings.max_batch
        for start in range(0, len(batch), step):
            results.extend(self._infer_chunk(batch[start : start + step]))
        return results

    def _infer_chunk(self, chunk: Sequence[ModelInput]) -> list[Detections]:
        """At most ``max_batch`` images, padded up to their bucket (padding's outputs are
        dropped: in-graph rows of images past the chunk, raw rows past it)."""
        tensor = self._to_tensor(chunk, bucket_for(len(chunk), self._buckets))
        if self._in_graph_post:
            from gpu_worker.detectors.graph_post import split_detections

            return split_detections(self._run_post(tensor), [m.letterbox for m in chunk])
        raw = self._run(tensor)
        return [self._decode(raw[i], m) for i, m in enumerate(chunk)]

    def _decode(self, raw: NDArray[np.float32], item: ModelInput) -> Detections:
        if self._grid is not None:
            xyxy, score, cls = decode_yolox(raw, self._grid, self._post.confidence_threshold)
        else:
            xyxy, score, cls = decode_ultralytics(raw)
        return select(xyxy, score, cls, item.letterbox, self._post)
