"""The Ultralytics backend on untrained models built offline (formats, shapes, speed).

No weights can be downloaded here: models are built from ``yolov8n.yaml`` by
``gpu_worker.export.build_untrained_model``. Nothing here judges accuracy.
Tests that need Ultralytics skip, with the reason, where the ``[ultralytics]``
extra is not installed; the error path for a missing extra runs everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from framerelay.detections import Detections
from framerelay.errors import ModelError
from framerelay.geometry import Letterbox
from gpu_worker.detectors import (
    ModelInput,
    UltralyticsDetectorSettings,
    load_detector,
    settings_for_model,
)
from gpu_worker.detectors.ultralytics_backend import INSTALL_HINT, UltralyticsDetector
from tests.support.ultralytics import (
    TORCH_ONNX_DEPRECATIONS,
    NetworkGuard,
    import_ultralytics,
)

pytestmark = [pytest.mark.filterwarnings(f) for f in TORCH_ONNX_DEPRECATIONS]
IMGSZ = 320
SEED = 2  # weights for which every test image has boxes scoring > 0.5 (checked below)
NAMES = tuple(f"thing{i}" for i in range(80))
SOURCE = (1280, 720)


# --- no network --------------------------------------------------------------


IMPORT_GUARD = NetworkGuard()


@pytest.fixture(scope="module")
def ultralytics() -> ModuleType:
    return import_ultralytics(IMPORT_GUARD)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkGuard]:
    guard = NetworkGuard()
    guard.install(monkeypatch)
    yield guard
    assert guard.attempts == [], f"tests reached for the network: {guard.attempts}"


# --- models ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def pt_model(ultralytics: ModuleType, model_dir: Path) -> Path:
    from gpu_worker.export import build_untrained_model

    with pytest.MonkeyPatch.context() as mp:
        NetworkGuard().install(mp)
        return build_untrained_model(
            model_dir / "yolov8n-untrained.pt", imgsz=IMGSZ, class_names=NAMES, seed=SEED
        )


@pytest.fixture(scope="module")
def onnx_model(pt_model: Path, model_dir: Path) -> Path:
    from gpu_worker.export import ExportOptions, export_onnx

    with pytest.MonkeyPatch.context() as mp:
        NetworkGuard().install(mp)
        return export_onnx(pt_model, model_dir / "exported.onnx", ExportOptions(imgsz=IMGSZ))


@pytest.fixture(scope="module")
def detector_factory(pt_model: Path) -> Callable[..., UltralyticsDetector]:
    def make(**overrides: object) -> UltralyticsDetector:
        detector = load_detector(settings_for_model(pt_model, device="cpu", **overrides))
        assert isinstance(detector, UltralyticsDetector)
        return detector

    return make


def _batch(n: int, seed: int = 0) -> list[ModelInput]:
    rng = np.random.default_rng(seed)
    lb = Letterbox.fit(*SOURCE, IMGSZ, IMGSZ)
    return [
        ModelInput(rng.integers(0, 256, (IMGSZ, IMGSZ, 3), dtype=np.uint8), lb) for _ in range(n)
    ]


def _assert_well_formed(det: Detections) -> None:
    assert det.xyxy.dtype == np.float32 and det.xyxy.shape == (len(det), 4)
    assert det.confidence.dtype == np.float32 and det.confidence.shape == (len(det),)
    assert det.class_id.dtype == np.int32 and det.tracker_id.dtype == np.int64
    assert np.all(det.xyxy[:, [0, 2]] >= 0) and np.all(det.xyxy[:, [0, 2]] <= SOURCE[0])
    assert np.all(det.xyxy[:, [1, 3]] >= 0) and np.all(det.xyxy[:, [1, 3]] <= SOURCE[1])
    assert np.all(det.xyxy[:, 2] >= det.xyxy[:, 0]) and np.all(det.xyxy[:, 3] >= det.xyxy[:, 1])
    assert np.all((det.class_id >= 0) & (det.class_id < len(NAMES)))


# --- offline behaviour ---------------------------------------------------------


def test_ultralytics_is_imported_offline(ultralytics: ModuleType) -> None:
    from ultralytics import utils

    assert utils.ONLINE is False
    assert utils.AUTOINSTALL is False
    assert IMPORT_GUARD.attempts == []
    # The first test module to load set it (setdefault): a temporary folder, not $HOME.
    assert Path(utils.USER_CONFIG_DIR).is_relative_to(os.environ["YOLO_CONFIG_DIR"])
    assert Path(os.environ["YOLO_CONFIG_DIR"]).is_relative_to(tempfile.gettempdir())


_PROBE = """
import json, socket, sys
attempts = []
real = socket.getaddrinfo
def guard(host, *a, **k):
    if host not in ("localhost", "127.0.0.1", "::1"):
        attempts.append(str(host))
        raise socket.gaierror(socket.EAI_NONAME, "blocked")
    return real(host, *a, **k)
socket.getaddrinfo = guard
from gpu_worker.detectors.ultralytics_backend import import_ultralytics
import_ultralytics()
from ultralytics import utils
import os
print(json.dumps({"online": utils.ONLINE, "autoinstall": utils.AUTOINSTALL, "dns": attempts,
                  "omp": os.environ.get("OMP_NUM_THREADS")}))
"""


def test_backend_import_defaults_to_offline_in_a_clean_environment(
    ultralytics: ModuleType, tmp_path: Path
) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("YOLO_") and k != "OMP_NUM_THREADS"
    }
    env["YOLO_CONFIG_DIR"] = str(tmp_path)  # keep the child's settings.json out of $HOME
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe == {"online": False, "autoinstall": False, "dns": [], "omp": None}


# --- loading -------------------------------------------------------------------


def test_loads_through_the_worker_factory(
    detector_factory: Callable[..., UltralyticsDetector],
) -> None:
    detector = detector_factory()
    assert detector.input_size == (IMGSZ, IMGSZ)
    assert detector.class_names == NAMES
    assert detector.providers == ("torch:cpu",)
    meta = detector.metadata()
    assert meta["task"] == "detect" and meta["stride"] == "32" and meta["imgsz"] == str(IMGSZ)


def test_auto_device_is_reported(pt_model: Path) -> None:
    import torch

    detector = load_detector(settings_for_model(pt_model))
    expected = "torch:cuda:0" if torch.cuda.is_available() else "torch:cpu"
    assert detector.providers == (expected,)


def test_missing_gpu_is_a_model_error(pt_model: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here")
    with pytest.raises(ModelError, match="device 'cuda:0' is not usable"):
        UltralyticsDetector(UltralyticsDetectorSettings(model=pt_model, device="cuda:0"))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.pt", None, "model file not found"),
        ("garbage.pt", b"not a checkpoint", "cannot load .* with Ultralytics"),
        ("model.onnx", b"x", "serves PyTorch '.pt' files"),
    ],
)
def test_bad_model_files_are_model_errors(
    ultralytics: ModuleType, tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        UltralyticsDetector(UltralyticsDetectorSettings(model=path))


def test_a_classification_model_is_refused(ultralytics: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "cls.pt"
    ultralytics.YOLO("yolov8n-cls.yaml").save(str(path))
    with pytest.raises(ModelError, match="'classify' model; framerelay serves detection"):
        UltralyticsDetector(UltralyticsDetectorSettings(model=path))


def test_missing_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "ultralytics", None)  # import raises ImportError
    with pytest.raises(ModelError, match=r"framerelay\[ultralytics\]") as err:
        load_detector(settings_for_model(path))
    assert INSTALL_HINT in str(err.value)


# --- inference -----------------------------------------------------------------


@pytest.mark.parametrize(("n", "max_batch"), [(1, 8), (3, 2), (4, 4)])
def test_infer_returns_one_detections_per_image(
    detector_factory: Callable[..., UltralyticsDetector], n: int, max_batch: int
) -> None:
    detector = detector_factory(confidence_threshold=0.5, max_batch=max_batch)
    results = detector.infer(_batch(n))
    assert len(results) == n
    for det in results:
        _assert_well_formed(det)
    assert sum(len(d) for d in results) > 0, "a seeded untrained model scores some boxes > 0.5"


def test_empty_batch(detector_factory: Callable[..., UltralyticsDetector]) -> None:
    assert detector_factory().infer([]) == []


def test_thresholds_and_caps_are_respected(
    detector_factory: Callable[..., UltralyticsDetector],
) -> None:
    loose = detector_factory(confidence_threshold=0.3).infer(_batch(2))
    strict = detector_factory(confidence_threshold=0.7).infer(_batch(2))
    capped = detector_factory(confidence_threshold=0.0, max_detections=7).infer(_batch(2))
    for lo, hi, cap in zip(loose, strict, capped, strict=True):
        assert np.all(lo.confidence > 0.3) and np.all(hi.confidence > 0.7)
        assert len(hi) < len(lo)
        assert len(cap) == 7


@pytest.mark.parametrize("shape", [(IMGSZ, IMGSZ + 32, 3), (IMGSZ, IMGSZ, 1)])
def test_wrong_input_size_is_a_model_error(
    detector_factory: Callable[..., UltralyticsDetector], shape: tuple[int, ...]
) -> None:
    lb = Letterbox.fit(*SOURCE, IMGSZ, IMGSZ)
    with pytest.raises(ModelError, match=f"input images must be uint8 {IMGSZ}x{IMGSZ}x3"):
        detector_factory().infer([ModelInput(np.zeros(shape, np.uint8), lb)])


def test_pt_and_exported_onnx_agree_in_source_pixels(
    detector_factory: Callable[..., UltralyticsDetector], onnx_model: Path
) -> None:
    """Same inputs through both backends: same boxes in source pixels (no re-letterbox)."""
    batch = _batch(3, seed=7)
    pt = detector_factory(confidence_threshold=0.5).infer(batch)
    ox = load_detector(
        settings_for_model(onnx_model, confidence_threshold=0.5, providers="cpu")
    ).infer(batch)
    for a, b in zip(pt, ox, strict=True):
        assert len(a) == len(b) > 0
        # Pair the two sets one-to-one: equal scores may come out in either order.
        gap = np.abs(a.xyxy[:, None, :] - b.xyxy[None, :, :]).max(axis=2)
        gap += 1e3 * np.abs(a.confidence[:, None] - b.confidence[None, :])
        gap += 1e6 * (a.class_id[:, None] != b.class_id[None, :])
        rows, cols = linear_sum_assignment(gap)
        assert gap[rows, cols].max() < 0.1, "a box, score or class differs between backends"


@pytest.mark.parametrize(
    "letterbox",
    [
        Letterbox.fit(*SOURCE, IMGSZ, IMGSZ),  # top-left, as ingest makes them
        Letterbox(640, 480, IMGSZ, IMGSZ, 0.5, 0, 40),  # centred, as Ultralytics makes them
    ],
    ids=["top-left", "centred"],
)
def test_boxes_are_mapped_through_each_images_letterbox(
    detector_factory: Callable[..., UltralyticsDetector], letterbox: Letterbox
) -> None:
    """Boxes are Ultralytics' model-pixel boxes mapped by the item's own letterbox."""
    image = _batch(1)[0].image
    identity = Letterbox(IMGSZ, IMGSZ, IMGSZ, IMGSZ, 1.0)
    detector = detector_factory(confidence_threshold=0.5)
    raw, mapped = detector.infer([ModelInput(image, identity), ModelInput(image, letterbox)])
    assert len(raw) == len(mapped) > 0
    np.testing.assert_allclose(mapped.xyxy, letterbox.to_source(raw.xyxy), atol=1e-3)
    np.testing.assert_array_equal(mapped.confidence, raw.confidence)


def test_speed_print(
    detector_factory: Callable[..., UltralyticsDetector], onnx_model: Path
) -> None:
    """Not a timed assertion: prints ms per image for the record."""
    pt = detector_factory(confidence_threshold=0.25)
    ox = load_detector(settings_for_model(onnx_model, confidence_threshold=0.25, providers="cpu"))
    lines = []
    for name, detector in (("ultralytics .pt", pt), ("onnxruntime export", ox)):
        for n in (1, 4):
            batch = _batch(n)
            detector.infer(batch)
            start = time.perf_counter()
            detector.infer(batch)
            ms = (time.perf_counter() - start) * 1000 / n
            lines.append(f"{name} {IMGSZ}px batch {n}: {ms:.1f} ms/image ({detector.providers[0]})")
    print("\n" + "\n".join(lines))
