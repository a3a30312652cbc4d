"""ONNX Runtime provider lists with options (pure), the GPU settings, and what is reported."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
from pydantic import ValidationError

from framerelay.errors import ConfigError
from gpu_worker.detectors import ort_providers as op
from gpu_worker.detectors.base import (
    IMAGE_ENGINE_CACHE,
    Acceleration,
    OnnxDetectorSettings,
    acceleration_of,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "samples" / "models" / "yolox_nano_416.onnx"
SHAPE = op.ModelShape("images", 3, 416, 416, dynamic_batch=True)
ALL = (op.TENSORRT, op.CUDA, op.CPU)


@pytest.mark.parametrize(
    ("wanted", "available", "chosen"),
    [
        ("auto", ALL, [op.TENSORRT, op.CUDA, op.CPU]),
        ("auto", (op.CUDA, op.CPU), [op.CUDA, op.CPU]),
        ("auto", ("AzureExecutionProvider", op.CPU), [op.CPU]),
        ("tensorrt", ALL, [op.TENSORRT, op.CUDA, op.CPU]),
        ("cuda", ALL, [op.CUDA, op.CPU]),
        ("cpu", ALL, [op.CPU]),
        ("cuda", (), [op.CPU]),
    ],
)
def test_choose_providers(wanted: str, available: tuple[str, ...], chosen: list[str]) -> None:
    assert op.choose_providers(wanted, available) == chosen


def test_unknown_provider_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown providers 'rocm'"):
        op.choose_providers("rocm", ALL)


def test_tensorrt_options_fp16_caches_and_profile(tmp_path: Path) -> None:
    opts = op.tensorrt_options(op.GpuOptions(fp16=True, cache_dir=tmp_path, max_batch=16), SHAPE)
    assert opts == {
        "device_id": "0",
        "trt_fp16_enable": "1",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(tmp_path),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(tmp_path),
        "trt_profile_min_shapes": "images:1x3x416x416",
        "trt_profile_opt_shapes": "images:16x3x416x416",
        "trt_profile_max_shapes": "images:16x3x416x416",
    }
    assert all(isinstance(v, str) for v in opts.values())  # ORT's binding wants strings


def test_fp16_off_and_a_fixed_batch_axis_has_no_profile(tmp_path: Path) -> None:
    fixed = op.ModelShape("x", 3, 640, 384, dynamic_batch=False)
    opts = op.tensorrt_options(op.GpuOptions(fp16=False, cache_dir=tmp_path, max_batch=8), fixed)
    assert opts["trt_fp16_enable"] == "0"
    assert not any(k.startswith("trt_profile_") for k in opts)


def test_profile_spells_width_and_height_in_onnx_order() -> None:
    shape = op.ModelShape("input.1", 3, 384, 640, dynamic_batch=True)
    assert op.tensorrt_profile(shape, 4)["trt_profile_max_shapes"] == "input.1:4x3x384x640"


def test_tensorrt_without_a_cache_dir_is_refused() -> None:
    with pytest.raises(ConfigError, match="engine cache directory"):
        op.tensorrt_options(op.GpuOptions(cache_dir=None), SHAPE)


def test_build_providers_gives_each_its_options(tmp_path: Path) -> None:
    specs = op.build_providers(ALL, op.GpuOptions(cache_dir=tmp_path, max_batch=2), SHAPE)
    assert [name for name, _ in specs] == list(ALL)
    trt, cuda, cpu = (options for _, options in specs)
    assert trt["trt_engine_cache_path"] == str(tmp_path)
    assert cuda == {
        "device_id": "0",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "1",
    }
    assert cpu == {}


def test_cuda_alone_needs_no_cache_dir() -> None:
    specs = op.build_providers([op.CUDA, op.CPU], op.GpuOptions(cache_dir=None), SHAPE)
    assert [name for name, _ in specs] == [op.CUDA, op.CPU]


def test_real_onnxruntime_takes_the_list_form() -> None:
    specs = op.build_providers([op.CPU], op.GpuOptions(), SHAPE)
    session = ort.InferenceSession(str(MODEL), providers=specs)
    assert session.get_providers() == [op.CPU]


@pytest.mark.parametrize(
    ("providers", "gpu"),
    [((op.CPU,), False), ((op.CUDA, op.CPU), True), ((op.TENSORRT, op.CUDA, op.CPU), True)],
)
def test_on_gpu(providers: tuple[str, ...], gpu: bool) -> None:
    assert op.on_gpu(providers) is gpu


def test_cache_dir_is_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert op.prepare_cache_dir(target) == target.resolve()
    assert target.is_dir() and list(target.iterdir()) == []  # the write check leaves nothing


def test_unwritable_cache_dir_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as caught:
        op.prepare_cache_dir(blocker / "trt")
    message = str(caught.value)
    assert "\n" not in message
    assert str(blocker / "trt") in message and "ENGINE_CACHE_DIR" in message


def test_settings_defaults_and_env_names() -> None:
    s = OnnxDetectorSettings(model=MODEL)
    assert (s.fp16, s.engine_cache_dir, s.io_binding) == (True, None, "auto")
    with pytest.raises(ValidationError, match="io_binding"):
        OnnxDetectorSettings.model_validate({"model": MODEL, "io_binding": "maybe"})


def test_explicit_cache_dir_wins(tmp_path: Path) -> None:
    s = OnnxDetectorSettings(model=MODEL, engine_cache_dir=tmp_path)
    assert s.engine_cache_path() == tmp_path


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if IMAGE_ENGINE_CACHE.is_dir():
        pytest.skip(f"{IMAGE_ENGINE_CACHE} exists here (the image's volume wins)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert OnnxDetectorSettings(model=MODEL).engine_cache_path() == tmp_path / "framerelay/trt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "framerelay" / "trt"
    assert OnnxDetectorSettings(model=MODEL).engine_cache_path() == expected


def test_acceleration_info() -> None:
    on = Acceleration(fp16=True, io_binding=True, engine_cache_dir=Path("/v/trt"))
    assert on.as_info() == {
        "fp16": True,
        "io_binding": True,
        "engine_cache_dir": "/v/trt",
        "in_graph_prep": False,
        "in_graph_post": False,
        "batch_buckets": [],
        "artefact_cache": None,
        "artefact_key": None,
    }
    assert acceleration_of(object()).as_info() == {
        "fp16": False,
        "io_binding": False,
        "engine_cache_dir": None,
        "in_graph_prep": False,
        "in_graph_post": False,
        "batch_buckets": [],
        "artefact_cache": None,
        "artefact_key": None,
    }
