"""Worker settings: ignored, renamed and retired names are warned about by name only."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from framerelay.cli import build_parser
from framerelay.commands.worker import startup_warnings
from framerelay.settings import DEFAULT_MODEL
from gpu_worker.detectors.base import OnnxDetectorSettings
from gpu_worker.settings import WorkerSettings, env_warnings, unknown_env


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("FRAMERELAY_WORKER_TRACKER", ["retired", "no effect", "OPEN"]),
        ("FRAMERELAY_WORKER_FAULT", ["not a worker setting", "TEST_FAULT"]),
        ("FRAMERELAY_WORKER_TYPO", ["not a worker setting"]),
    ],
)
def test_env_warnings_name_what_replaced_a_setting(name: str, words: list[str]) -> None:
    environ = {name: "s3cret-value", "FRAMERELAY_WORKER_PORT": "0", "HOME": "/root"}
    assert unknown_env(environ) == [name]
    (warning,) = env_warnings(environ)
    assert warning.startswith(f"ignoring {name}:")
    assert all(w in warning for w in words), warning
    assert "s3cret-value" not in warning


def test_the_retired_tracker_setting_is_gone() -> None:
    assert "tracker" not in WorkerSettings.model_fields
    with pytest.raises(ValidationError):
        WorkerSettings(tracker="bytetrack")


@pytest.mark.parametrize(("argv", "warned"), [([], False), (["--tracker", "bytetrack"], True)])
def test_the_retired_tracker_option_warns(argv: list[str], warned: bool) -> None:
    args = build_parser().parse_args(["worker", *argv])
    warnings = startup_warnings(args, {})
    assert any("--tracker" in w and "retired" in w for w in warnings) is warned
    assert "tracker" not in WorkerSettings.model_fields


def test_a_detector_given_in_part_is_the_default_onnx_detector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Regression: the CUDA image's FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR alone made
    every worker exit with "Unable to extract tag using discriminator 'type'"."""
    monkeypatch.setenv("FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FRAMERELAY_WORKER_DETECTOR__FP16", "false")
    detector = WorkerSettings().detector
    assert isinstance(detector, OnnxDetectorSettings)
    assert detector.engine_cache_dir == tmp_path and detector.fp16 is False
    assert detector.model == DEFAULT_MODEL
