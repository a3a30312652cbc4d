"""Deriving a model that keeps some of a YOLOX model's classes (the "vehicles" model of
docs/models.md): the command as the docs give it, the detections it keeps, bad input."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from framerelay.errors import ModelError
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb
from gpu_worker.detectors import ModelInput, OnnxDetectorSettings, load_detector
from gpu_worker.detectors.class_subset import keep_classes, main
from tests.conftest import MODEL, ROOT
from tests.support.models import KITTI_STILL

DOC = ROOT / "docs" / "models.md"


def _doc_args(out: Path) -> list[str]:
    block = re.search(r"class_subset \\\n(.*?)#", DOC.read_text(), re.S)
    assert block is not None, "the command is in docs/models.md"
    args = shlex.split(block.group(1))
    return [str(ROOT / args[0]), str(out), *args[2:]]


def _detect(model: Path, names: tuple[str, ...] | None) -> list[tuple[str, float]]:
    settings = OnnxDetectorSettings(model=model, class_names=names, threads=1)
    detector = load_detector(settings)
    prepared = letterbox_jpeg(read_jpeg_rgb(KITTI_STILL), 416, 416)
    image = simplejpeg.decode_jpeg(prepared.data, colorspace="BGR")
    det = detector.infer([ModelInput(image, prepared.letterbox)])[0]
    keep = det.confidence >= 0.3
    found = zip(det.class_id[keep].tolist(), det.confidence[keep].tolist(), strict=True)
    return [(detector.class_names[c], float(s)) for c, s in found]


def test_the_docs_command_makes_a_vehicles_model_that_finds_the_coco_models_car(
    tmp_path: Path,
) -> None:
    out = tmp_path / "vehicles.onnx"
    assert main(_doc_args(out)) == 0
    vehicles = _detect(out, ("car", "bus", "truck"))
    coco = _detect(MODEL, None)
    assert {n for n, _ in vehicles} == {"car"}
    coco_cars = [s for n, s in coco if n == "car"]
    assert any(n == "person" for n, _ in coco)  # the COCO model also sees people here
    assert np.allclose(sorted(s for _, s in vehicles), sorted(coco_cars), atol=1e-4)


@pytest.mark.parametrize(
    ("keep", "message"),
    [([], "at least one class"), ([80], r"outside the model's 0\.\.79"), ([2, 2], "repeat")],
)
def test_bad_indices_are_refused(keep: list[int], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        keep_classes(MODEL.read_bytes(), keep)


def test_not_a_model_and_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelError, match="not an ONNX model"):
        keep_classes(b"nope", [0])
    assert main([str(tmp_path / "none.onnx"), str(tmp_path / "o.onnx"), "2"]) == 1
    assert main([str(MODEL), str(tmp_path / "o.onnx"), "two"]) == 1
    assert main([]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: cannot read") and err[1].startswith("error: invalid literal")
