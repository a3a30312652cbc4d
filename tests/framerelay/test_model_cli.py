"""``framerelay model export`` / ``framerelay model info`` through the real CLI entry point.

Inspection and argument errors run everywhere (tiny ONNX models built here);
export needs the ``[ultralytics]`` extra and skips, with the reason, without it.
Models are untrained, built offline: formats and shapes, not accuracy.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from framerelay.cli import main
from framerelay.geometry import Letterbox
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from tests.support.ultralytics import TORCH_ONNX_DEPRECATIONS, NetworkGuard, import_ultralytics

# Ultralytics itself ignores torch.jit.TracerWarning at import (a static-shape
# export compares shapes while tracing); pytest's "error" filter would undo that.
pytestmark = [
    *(pytest.mark.filterwarnings(f) for f in TORCH_ONNX_DEPRECATIONS),
    pytest.mark.filterwarnings(
        "ignore:Converting a tensor to a Python boolean might cause the trace to be incorrect"
    ),
]
IMGSZ = 320
NAMES = tuple(f"thing{i}" for i in range(80))


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkGuard]:
    """Refuse, record and fail on any lookup or connection beyond loopback."""
    guard = NetworkGuard()
    guard.install(monkeypatch)
    yield guard
    assert guard.attempts == [], f"the CLI reached for the network: {guard.attempts}"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- tiny ONNX models, no Ultralytics needed -------------------------------------


def tiny_onnx(path: Path, names: dict[int, str] | None, size: int = 64) -> Path:
    """A conv 'detector' with the Ultralytics layout (batch, 4 + C, anchors)."""
    channels = 4 + (len(names) if names else 80)
    weight = np.random.default_rng(0).normal(0, 0.1, (channels, 3, 8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["images", "w"], ["grid"], strides=[8, 8]),
        helper.make_node("Reshape", ["grid", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", channels, None])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array([0, channels, -1], np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    if names is not None:
        helper.set_model_props(model, {"names": repr(names), "task": "detect"})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_model_help_lists_the_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "export" in out and "info" in out


@pytest.mark.parametrize("argv", [["model"], ["model", "export"], ["model", "info"]])
def test_missing_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_info_on_an_ultralytics_layout_onnx(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_onnx(tmp_path / "tiny.onnx", {0: "cat", 1: "dog"})
    code, out, _ = run(["model", "info", str(model), "--providers", "cpu"], capsys)
    assert code == 0
    assert "images float32[batch, 3, 64, 64]" in out
    assert "output0 float32[batch, 6, ?]" in out
    assert "ultralytics (B, 4 + 2, anchors)" in out
    assert "2: cat, dog" in out
    assert "CPUExecutionProvider" in out
    assert "meta task" in out


def test_info_without_names_metadata_reads_as_yolox_with_coco_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_onnx(tmp_path / "plain.onnx", None)
    code, out, _ = run(["model", "info", str(model)], capsys)
    assert code == 0
    assert "yolox (B, anchors, 5 + 80)" in out
    assert "80: person, bicycle, car" in out


def _dummy(tmp_path: Path, name: str, content: bytes = b"not a model") -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["model", "info", "{tmp}/missing.onnx"], "no such file"),
        (["model", "info", "{tmp}/notes.txt"], "expected a .onnx or .pt file, got '.txt'"),
        (["model", "info", "{tmp}/garbage.onnx"], "not a readable ONNX model"),
        (["model", "export", "{tmp}/missing.pt"], "no such file"),
        (["model", "export", "{tmp}/garbage.onnx"], "expected a .pt file, got '.onnx'"),
        (["model", "export", "{tmp}/garbage.pt", "--out", "{tmp}/x.txt"], "must name an .onnx"),
        (["model", "export", "{tmp}/garbage.pt", "--imgsz", "100"], "multiple of 32"),
        (["model", "export", "{tmp}/garbage.pt", "--opset", "5"], r"--opset must be in"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    for name in ("notes.txt", "garbage.onnx", "garbage.pt"):
        _dummy(tmp_path, name)
    code, _, err = run([a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2
    assert err.startswith("framerelay: error: ")
    assert message in err
    assert not (tmp_path / "x.txt").exists()


def test_export_without_the_extra_names_the_install_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ultralytics", None)  # import raises ImportError
    code, _, err = run(["model", "export", _dummy(tmp_path, "m.pt")], capsys)
    assert code == 2
    assert "pip install 'framerelay[ultralytics]'" in err


# --- export, with the [ultralytics] extra -----------------------------------------


@pytest.fixture(scope="module")
def ultralytics() -> ModuleType:
    return import_ultralytics()


@pytest.fixture(scope="module")
def pt_model(ultralytics: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_worker.export import build_untrained_model

    out = tmp_path_factory.mktemp("pt") / "yolov8n-untrained.pt"
    return build_untrained_model(out, imgsz=IMGSZ, class_names=NAMES, seed=2)


def _io(path: Path) -> tuple[list[int | str], list[int | str], int]:
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)

    def dims(value: Any) -> list[int | str]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    elem = proto.graph.input[0].type.tensor_type.elem_type
    return dims(proto.graph.input[0]), dims(proto.graph.output[0]), elem


def test_export_writes_the_onnx_the_worker_serves(
    pt_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "served" / "model.onnx"
    argv = ["model", "export", str(pt_model), "--out", str(out_path), "--imgsz", str(IMGSZ)]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert sorted(p.name for p in pt_model.parent.iterdir()) == [pt_model.name]  # nothing beside
    assert "self-check: loaded with the worker's ONNX detector" in out
    assert "output0 float32[batch, 84, 2100]" in out  # 40² + 20² + 10² anchors at 320
    assert "ultralytics (B, 4 + 80, anchors)" in out and "80: thing0, thing1" in out
    assert "ms/image" in out and "providers" in out
    assert _io(out_path)[:2] == (["batch", 3, IMGSZ, IMGSZ], ["batch", 84, 2100])

    detector = load_detector(settings_for_model(out_path, providers="cpu", max_batch=4))
    assert detector.input_size == (IMGSZ, IMGSZ) and detector.class_names == NAMES
    assert getattr(detector, "format", None) == "ultralytics"
    lb = Letterbox.fit(1280, 720, IMGSZ, IMGSZ)
    rng = np.random.default_rng(0)
    batch = [ModelInput(rng.integers(0, 256, (IMGSZ, IMGSZ, 3), np.uint8), lb) for _ in range(3)]
    results = detector.infer(batch)
    assert len(results) == 3
    for det in results:
        assert det.xyxy.dtype == np.float32 and det.xyxy.shape == (len(det), 4)
        assert det.confidence.dtype == np.float32 and det.class_id.dtype == np.int32


def test_export_defaults_beside_the_model(
    pt_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "mine.pt"
    shutil.copyfile(pt_model, model)
    code, _, err = run(["model", "export", str(model), "--imgsz", "256", "--no-check"], capsys)
    assert code == 0, err
    assert _io(tmp_path / "mine.onnx")[:2] == (["batch", 3, 256, 256], ["batch", 84, 1344])


def test_export_no_dynamic_fixes_the_batch_axis(
    pt_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "static.onnx"
    argv = ["model", "export", str(pt_model), "--out", str(out_path), "--no-dynamic"]
    code, out, err = run([*argv, "--imgsz", str(IMGSZ)], capsys)
    assert code == 0, err
    assert _io(out_path)[:2] == ([1, 3, IMGSZ, IMGSZ], [1, 84, 2100])
    assert "images float32[1, 3, 320, 320]" in out


def test_export_half_keeps_float32_io_and_halves_the_file(
    pt_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, half = tmp_path / "fp32.onnx", tmp_path / "fp16.onnx"
    base = ["model", "export", str(pt_model), "--imgsz", str(IMGSZ), "--no-check", "--out"]
    assert run([*base, str(full)], capsys)[0] == 0
    code, _, err = run([*base, str(half), "--half"], capsys)
    assert code == 0, err
    assert _io(half) == (["batch", 3, IMGSZ, IMGSZ], ["batch", 84, 2100], TensorProto.FLOAT)
    assert half.stat().st_size < 0.7 * full.stat().st_size
    detector = load_detector(settings_for_model(half, providers="cpu"))
    lb = Letterbox.fit(IMGSZ, IMGSZ, IMGSZ, IMGSZ)
    assert len(detector.infer([ModelInput(np.zeros((IMGSZ, IMGSZ, 3), np.uint8), lb)])) == 1


def test_export_of_a_three_class_model(
    ultralytics: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_worker.export import build_untrained_model

    pt = build_untrained_model(tmp_path / "three.pt", imgsz=IMGSZ, class_names=("a", "b", "c"))
    code, out, err = run(["model", "export", str(pt), "--imgsz", str(IMGSZ)], capsys)
    assert code == 0, err
    assert _io(tmp_path / "three.onnx")[1] == ["batch", 7, 2100]
    assert "3: a, b, c" in out


def test_info_on_a_pt_checkpoint(pt_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    code, out, err = run(["model", "info", str(pt_model)], capsys)
    assert code == 0, err
    assert "pytorch (Ultralytics checkpoint)" in out
    assert f"images float32[batch, 3, {IMGSZ}, {IMGSZ}]" in out
    assert "80: thing0" in out
    assert ("torch:cuda:0" if torch.cuda.is_available() else "torch:cpu") in out
