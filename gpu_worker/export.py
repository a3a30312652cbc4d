"""Model export and inspection: the deploy step that bakes models into images.

``export_onnx`` turns an Ultralytics ``.pt`` detector into the ONNX file the
worker serves: input ``images`` float32 ``(batch, 3, H, W)`` with a symbolic
batch axis only (the worker needs a fixed H and W), output ``output0``
``(batch, 4 + C, anchors)``, class names in the ``names`` metadata.
``self_check`` loads a model exactly as the worker does (``load_detector``) and
runs it once; ``describe`` reads a model's inputs, outputs and metadata.

Only this module and the detector backends import onnxruntime/Ultralytics; the
``framerelay model`` CLI calls in here lazily.
"""

from __future__ import annotations

import importlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from framerelay.errors import ConfigError, ModelError
from framerelay.geometry import PAD_VALUE, Letterbox
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model

SUFFIXES = (".onnx", ".pt")
log = logging.getLogger(__name__)
_META_KEYS = ("description", "version", "task", "imgsz", "stride", "batch", "end2end", "author")


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """What ``framerelay model export`` asks of Ultralytics."""

    imgsz: int = 640
    opset: int | None = None
    dynamic_batch: bool = True
    half: bool = False
    simplify: bool = True

    def __post_init__(self) -> None:
        if not 32 <= self.imgsz <= 4096 or self.imgsz % 32:
            raise ConfigError(f"--imgsz must be a multiple of 32 in [32, 4096], got {self.imgsz}")
        if self.opset is not None and not 9 <= self.opset <= 30:
            raise ConfigError(f"--opset must be in [9, 30], got {self.opset}")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One graph input or output; symbolic axes keep their names."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True)
class ModelReport:
    """What a model file holds, as the worker sees it."""

    path: Path
    file_format: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    layout: str
    class_names: tuple[str, ...]
    input_size: tuple[int, int] | None = None
    providers: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    ms_per_image: float | None = None
    batch_images: int = 0


def check_model_path(path: Path, suffixes: tuple[str, ...] = SUFFIXES) -> Path:
    """``path`` if it is an existing file with a known suffix, else :class:`ConfigError`."""
    if path.suffix.lower() not in suffixes:
        raise ConfigError(f"{path}: expected a {' or '.join(suffixes)} file, got {path.suffix!r}")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    return path


def export_onnx(model: Path, out: Path | None = None, options: ExportOptions | None = None) -> Path:
    """Export an Ultralytics ``.pt`` detector to ``out`` (default: beside it, ``.onnx``).

    Ultralytics writes its ONNX beside the checkpoint it reads, so the
    checkpoint is copied into a temporary folder first: nothing next to
    ``model`` is overwritten except ``out`` itself.
    """
    from gpu_worker.detectors.ultralytics_backend import load_yolo

    opts = options or ExportOptions()
    check_model_path(model, (".pt",))
    dest = out if out is not None else model.with_suffix(".onnx")
    if dest.suffix.lower() != ".onnx":
        raise ConfigError(f"--out must name an .onnx file, got {dest}")
    with tempfile.TemporaryDirectory(prefix="framerelay-export-") as tmp:
        staged = Path(tmp) / model.name
        shutil.copyfile(model, staged)
        yolo = load_yolo(staged)
        if str(getattr(yolo, "task", "")) != "detect":
            raise ModelError(f"{model} is a {yolo.task!r} model; only detection models export")
        produced = _run_exporter(yolo, model, opts)
        _finish_onnx(produced, opts.imgsz if opts.dynamic_batch else None)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(produced, dest)
    return dest


def build_untrained_model(
    out: Path,
    *,
    arch: str = "yolov8n.yaml",
    imgsz: int = 640,
    class_names: Sequence[str] | None = None,
    seed: int | None = None,
) -> Path:
    """Build an untrained Ultralytics detector offline from an architecture YAML; save it.

    For smoke tests, exports and speed checks where no weights can be
    downloaded: formats, shapes and speed are real, accuracy is nil. A fresh
    network scores every anchor near 0 whatever the image; with ``seed`` its
    outputs are made to depend on the image with scores spread over (0, 1), so
    thresholds, NMS and caps have work to do.
    """
    from gpu_worker.detectors.ultralytics_backend import import_ultralytics

    yolo_cls = import_ultralytics().YOLO
    tasks = importlib.import_module("ultralytics.nn.tasks")
    torch = importlib.import_module("torch")
    try:
        with torch.random.fork_rng(devices=[]):  # seed the weights, not the caller's RNG
            if seed is not None:
                torch.manual_seed(seed)
            yolo: Any = yolo_cls(arch, task="detect")
            if class_names is not None and len(class_names) != len(yolo.names):
                cfg = tasks.yaml_model_load(arch)
                cfg["nc"] = len(class_names)
                args = yolo.model.args
                yolo.model = tasks.DetectionModel(cfg, nc=len(class_names), verbose=False)
                yolo.model.args, yolo.model.task = args, "detect"
    except Exception as exc:  # unknown YAML, bad architecture, ...
        raise ModelError(f"cannot build {arch!r} with Ultralytics: {exc!r}") from exc
    if class_names is not None:
        yolo.model.names = dict(enumerate(class_names))
    yolo.model.args["imgsz"] = imgsz
    # A loaded checkpoint takes its args from "train_args", as a trained one would.
    yolo.ckpt = {**(yolo.ckpt or {}), "train_args": {"imgsz": imgsz, "task": "detect"}}
    if seed is not None:
        _spread_outputs(yolo.model, seed, imgsz)
    out.parent.mkdir(parents=True, exist_ok=True)
    yolo.save(str(out))
    return out


def _spread_outputs(model: Any, seed: int, imgsz: int) -> None:
    """Make an untrained model's outputs depend on the input, with scores spread over (0, 1).

    Batch-norm statistics are calibrated on seeded noise (without it the
    activations of a fresh network fade to a constant) and the class-score
    biases are raised from the "rare object" prior to -2.
    """
    torch = importlib.import_module("torch")
    gen = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    momenta = [bn.momentum for bn in norms]
    with torch.no_grad():
        for bn in norms:
            bn.momentum = 1.0
        model.train()
        model(torch.rand((4, 3, imgsz, imgsz), generator=gen))
        model.eval()
        for bn, momentum in zip(norms, momenta, strict=True):
            bn.momentum = momentum
        head = model.model[-1]
        for branch in (getattr(head, "cv3", None), getattr(head, "one2one_cv3", None)):
            for seq in branch or ():
                seq[-1].bias.fill_(-2.0)


@contextmanager
def _quiet_ultralytics() -> Iterator[None]:
    """Hide Ultralytics' INFO chatter (it names the temporary folder) unless debugging."""
    ul_log = logging.getLogger("ultralytics")
    before = ul_log.level
    if not log.isEnabledFor(logging.DEBUG):
        ul_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ul_log.setLevel(before)


def _run_exporter(yolo: Any, model: Path, opts: ExportOptions) -> Path:
    try:
        with _quiet_ultralytics():
            produced: Any = yolo.export(
                format="onnx",
                imgsz=opts.imgsz,
                opset=opts.opset,
                dynamic=opts.dynamic_batch,
                simplify=opts.simplify,
                quantize=16 if opts.half else None,
                batch=1,
                device="cpu",  # FP16 on CPU keeps float32 inputs/outputs, which the worker feeds
                verbose=False,
            )
    except Exception as exc:  # Ultralytics, torch.onnx and onnx raise many types
        raise ModelError(f"Ultralytics could not export {model} to ONNX: {exc!r}") from exc
    path = Path(str(produced))
    if not path.is_file():
        raise ModelError(f"Ultralytics reported {produced!r} but wrote no ONNX file")
    return path


def _finish_onnx(path: Path, pin_imgsz: int | None) -> None:
    """Make the export checker-valid and, with ``pin_imgsz``, fix all axes but the batch.

    Ultralytics' ``dynamic=True`` makes batch, height and width symbolic; the
    worker letterboxes to one fixed size and reads it from the input shape, so
    height and width (and then the output's anchor count) are pinned.
    """
    import onnx

    proto = onnx.load(str(path))
    if pin_imgsz is not None:
        _pin_image_size(proto, pin_imgsz)
    _sort_nodes(proto.graph)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{path}: the exported graph fails the ONNX checker: {exc}") from exc
    onnx.save(proto, str(path))


def _pin_image_size(proto: Any, imgsz: int) -> None:
    import onnxruntime as ort

    dims = proto.graph.input[0].type.tensor_type.shape.dim
    if len(dims) != 4:
        raise ModelError(f"expected a 4-D image input, got {len(dims)} axes")
    dims[2].dim_value = imgsz
    dims[3].dim_value = imgsz
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    probe = np.zeros((1, 3, imgsz, imgsz), np.float32)
    shapes = [o.shape for o in session.run(None, {session.get_inputs()[0].name: probe})]
    for out, shape in zip(proto.graph.output, shapes, strict=True):
        for axis, dim in enumerate(out.type.tensor_type.shape.dim):
            if axis > 0:
                dim.dim_value = int(shape[axis])


def _sort_nodes(graph: Any) -> None:
    """Order nodes topologically, as the ONNX checker requires.

    Ultralytics' FP16 conversion (``keep_io_types``) appends its input casts at
    the end of the node list; onnxruntime accepts that, the checker doesn't.
    """
    ready = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        waiting = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            raise ModelError(
                f"the exported graph has a cycle or a missing input at {waiting[0].name}"
            )
        pending = waiting
    copies = [type(n)() for n in ordered]
    for copy, node in zip(copies, ordered, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def self_check(path: Path, *, batch: int = 2, provider: str = "auto") -> ModelReport:
    """Load ``path`` with the worker's own detector, run one batch, and describe it."""
    report = describe(path, provider=provider)
    overrides: dict[str, object] = {"max_batch": max(1, batch)}
    if path.suffix.lower() == ".onnx":
        overrides["providers"] = provider
    detector = load_detector(settings_for_model(path, **overrides))
    w, h = detector.input_size
    rng = np.random.default_rng(0)
    lb = Letterbox.fit(w, h, w, h)
    images = [
        ModelInput(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), lb) for _ in range(batch - 1)
    ]
    images.append(ModelInput(np.full((h, w, 3), PAD_VALUE, np.uint8), lb))
    results = detector.infer(images)  # warm-up, and the batch axis works
    if len(results) != len(images):
        raise ModelError(f"{path}: {len(images)} images gave {len(results)} results")
    start = time.perf_counter()
    detector.infer(images)
    ms = (time.perf_counter() - start) * 1000 / len(images)
    return replace(report, ms_per_image=ms, batch_images=len(images))


def describe(path: Path, *, provider: str = "auto") -> ModelReport:
    """Inputs, outputs, layout, class names and providers of an ``.onnx`` or ``.pt`` model."""
    check_model_path(path)
    if path.suffix.lower() == ".onnx":
        return _describe_onnx(path, provider)
    return _describe_pt(path)


def _tensor_infos(values: Any) -> tuple[TensorInfo, ...]:
    import onnx

    infos = []
    for value in values:
        ttype = value.type.tensor_type
        shape = tuple(_dim(d) for d in ttype.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type).name
        infos.append(TensorInfo(value.name, shape, dtype))
    return tuple(infos)


def _dim(dim: Any) -> int | str:
    """An axis: its size, its symbolic name, or '?' where the graph says neither."""
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    return str(dim.dim_param) if dim.HasField("dim_param") else "?"


def _describe_onnx(path: Path, provider: str) -> ModelReport:
    import onnx

    from gpu_worker.detectors.onnx_backend import OnnxDetector

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends
        raise ModelError(f"{path} is not a readable ONNX model: {exc!r}") from exc
    meta = {p.key: p.value for p in proto.metadata_props if p.key in _META_KEYS}
    inputs = _tensor_infos(proto.graph.input)
    outputs = _tensor_infos(proto.graph.output)
    settings = settings_for_model(path, providers=provider, max_batch=1)
    detector = load_detector(settings)
    if not isinstance(detector, OnnxDetector):
        raise ModelError(f"{path}: expected the ONNX backend, got {type(detector).__name__}")
    return ModelReport(
        path=path,
        file_format="onnx",
        inputs=inputs,
        outputs=outputs,
        layout=_layout(detector.format, len(detector.class_names)),
        class_names=detector.class_names,
        input_size=detector.input_size,
        providers=detector.providers,
        metadata=meta,
    )


def _describe_pt(path: Path) -> ModelReport:
    from gpu_worker.detectors.ultralytics_backend import UltralyticsDetector

    settings = settings_for_model(path)
    detector = load_detector(settings)
    if not isinstance(detector, UltralyticsDetector):
        raise ModelError(f"{path}: expected the Ultralytics backend, got {type(detector).__name__}")
    w, h = detector.input_size
    n = len(detector.class_names)
    return ModelReport(
        path=path,
        file_format="pytorch (Ultralytics checkpoint)",
        inputs=(TensorInfo("images", ("batch", 3, h, w), "float32"),),
        outputs=(TensorInfo("output0", ("batch", 4 + n, "anchors"), "float32"),),
        layout=_layout("ultralytics", n),
        class_names=detector.class_names,
        input_size=detector.input_size,
        providers=detector.providers,
        metadata=detector.metadata(),
    )


def _layout(model_format: str, num_classes: int) -> str:
    if model_format == "yolox":
        return f"yolox (B, anchors, 5 + {num_classes}): cx, cy, log w, log h, objectness, scores"
    return f"ultralytics (B, 4 + {num_classes}, anchors): cx, cy, w, h, class scores"
