"""The model registry: the built-in entry, files, and one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from framerelay.data import CANARY_STILL, DEFAULT_MODEL
from framerelay.errors import ConfigError
from framerelay.model_registry import (
    BUILTIN_NAME,
    builtin_registry,
    check_files,
    load_registry,
)

VEHICLES = """
[models.vehicles]
file = "vehicles.onnx"
format = "yolox"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = { image = "still.jpg", expect = { car = 1 }, min_confidence = 0.5 }
"""


def _write(tmp_path: Path, text: str, name: str = "models.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_entry_is_the_shipped_coco_model() -> None:
    entry = builtin_registry().get(BUILTIN_NAME)
    assert entry.file == DEFAULT_MODEL and entry.canary.image == CANARY_STILL
    assert entry.classes[0] == "person" and len(entry.classes) == 80
    assert entry.canary.expect == {"person": 3}
    assert check_files(builtin_registry()) == []


def test_a_file_adds_entries_with_paths_relative_to_it(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, VEHICLES))
    entry = registry.get("vehicles")
    assert entry.file == tmp_path / "vehicles.onnx"
    assert entry.canary.image == tmp_path / "still.jpg"
    assert entry.canary.expect == {"car": 1} and entry.canary.min_confidence == 0.5
    assert BUILTIN_NAME in registry and entry.vram_mb == 300
    assert check_files(registry) == [
        f"model vehicles: model file not found: {tmp_path / 'vehicles.onnx'}",
        f"model vehicles: canary image not found: {tmp_path / 'still.jpg'}",
    ]


def test_json_and_file_uris(tmp_path: Path) -> None:
    text = (
        '{"models": {"v": {"uri": "file:///opt/m%20x.onnx", "input_w": 320, "input_h": 320,'
        ' "classes": ["a"], "vram_mb": 1, "canary": {"image": "s.jpg", "expect": {"a": 2}}}}}'
    )
    entry = load_registry(_write(tmp_path, text, "r.json")).get("v")
    assert entry.file == Path("/opt/m x.onnx") and entry.format == "auto"


def test_none_is_the_builtin_only() -> None:
    assert list(load_registry(None).entries) == [BUILTIN_NAME]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models.v\n", "not valid TOML"),
        ("x = 1", "expected one table 'models'"),
        ("[models]\nv = 3", "models.v must be a table"),
        (VEHICLES.replace("vram_mb = 300", "vram_mb = -1"), "models.vehicles.vram_mb: Input"),
        (VEHICLES.replace("vram_mb = 300", "vram_mb = 300\ncolour = 1"), "colour: Extra"),
        (VEHICLES.replace("{ car = 1 }", "{ person = 1 }"), "expects ['person'], which are not"),
        (VEHICLES.replace('file = "vehicles.onnx"', ""), "exactly one of 'file' and 'uri'"),
        (VEHICLES.replace('file = "vehicles.onnx"', 'uri = "https://x/m.onnx"'), "only file://"),
        (VEHICLES.replace("[models.vehicles]", '[models."bad name"]'), "String should match"),
        (VEHICLES.replace("input_w = 416", 'input_w = "wide"'), "input_w: Input should be"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")) as err:
        load_registry(_write(tmp_path, text))
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_missing_oversized_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_registry(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="over 1048576 bytes"):
        load_registry(_write(tmp_path, "#" * (1024 * 1024 + 1)))
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_registry(binary)


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown model 'ppe'; the registry has yolox_nano"):
        builtin_registry().get("ppe")
