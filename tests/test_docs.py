"""The README's configuration reference stays true to the settings models."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from deploy.settings import (
    KubernetesSettings,
    LocalSettings,
    OrchestratorSettings,
    RunPodSettings,
    TierConfig,
    Window,
)
from gpu_worker.detectors.base import OnnxDetectorSettings
from gpu_worker.settings import WorkerSettings
from ingest.recording.settings import RecorderSettings
from ingest.settings import IngestSettings, ResultsSettings, StreamConfig
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _names(model: type[BaseModel], prefix: str) -> list[str]:
    skip = {
        "token_secrets",
        "signing_keys",
        "detector",
        "type",
        "runpod",
        "local",
        "kubernetes",
        "results",
    }
    return [prefix + n.upper() if prefix else n for n in model.model_fields if n not in skip]


@pytest.mark.parametrize(
    "name",
    _names(WorkerSettings, "FRAMERELAY_WORKER_")
    + _names(OnnxDetectorSettings, "FRAMERELAY_WORKER_DETECTOR__")
    + _names(IngestSettings, "FRAMERELAY_INGEST_")
    + _names(StreamConfig, "")
    + _names(ResultsSettings, "FRAMERELAY_INGEST_RESULTS__")
    + [
        n
        for n in _names(RecorderSettings, "FRAMERELAY_RECORD_")
        if n != "FRAMERELAY_RECORD_REDIS_URL"
    ]
    + _names(OrchestratorSettings, "FRAMERELAY_ORCH_")
    + _names(RunPodSettings, "FRAMERELAY_ORCH_RUNPOD__")
    + _names(LocalSettings, "FRAMERELAY_ORCH_LOCAL__")
    + _names(KubernetesSettings, "FRAMERELAY_ORCH_KUBERNETES__")
    + _names(TierConfig, "")
    + _names(Window, ""),
)
def test_every_setting_is_documented(name: str) -> None:
    short = name.replace("_TLS_KEY", "_TLS_CERT").replace("_TLS_CLIENT_KEY", "_TLS_CLIENT_CERT")
    short = short.replace("_API_PORT", "_API_HOST").replace("read_timeout_s", "open_timeout_s")
    short = short.replace("RECORD_READ_TIMEOUT_S", "RECORD_OPEN_TIMEOUT_S")
    assert f"`{name}`" in README or f"`{short}`" in README, f"{name} missing from README"


def test_readme_gives_exactly_the_two_setup_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    block = quick.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci
