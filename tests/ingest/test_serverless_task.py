"""Which streams an endpoint serves, the RunPod key from a secret file, the task's field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from framerelay.errors import ConfigError
from framerelay.jobs import JobTask
from ingest.serverless_link import ServerlessSettings
from ingest.serverless_task import ServerlessRuns
from ingest.settings import IngestSettings, StreamConfig

KEY = "rp_file_" + "f" * 24


def _config(endpoint: str | None, tmp_path: Path) -> StreamConfig:
    job = {"job_id": "j1", "index": 0, "sidecar": str(tmp_path / "a.jsonl"),
           "serverless_endpoint_id": endpoint}  # fmt: skip
    return StreamConfig(id="job-j1-0", url=str(tmp_path / "a.mp4"), realtime=False, job=job)


def test_only_tasks_naming_an_endpoint_are_served(tmp_path: Path) -> None:
    runs = ServerlessRuns(ServerlessSettings(api_key=SecretStr(KEY)), lambda r: None)
    assert runs.serves(_config("ep-1", tmp_path))
    assert not runs.serves(_config(None, tmp_path))
    assert not runs.serves(StreamConfig(id="cam", url="rtsp://127.0.0.1/x"))
    runs.check(_config("ep-1", tmp_path))


def test_an_endpoint_without_a_key_is_refused(tmp_path: Path) -> None:
    runs = ServerlessRuns(ServerlessSettings(), lambda r: None)
    runs.check(_config(None, tmp_path))
    with pytest.raises(ConfigError, match="FRAMERELAY_INGEST_SERVERLESS__API_KEY"):
        runs.check(_config("ep-1", tmp_path))


def test_the_key_comes_from_a_secret_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "runpod"
    secret.write_text(KEY + "\n")
    monkeypatch.setenv("FRAMERELAY_INGEST_SERVERLESS__API_KEY_FILE", str(secret))
    monkeypatch.setenv("FRAMERELAY_INGEST_SERVERLESS__JOB_DEADLINE_S", "120")
    settings = IngestSettings()
    assert settings.serverless.api_key is not None
    assert settings.serverless.api_key.get_secret_value() == KEY
    assert settings.serverless.job_deadline_s == 120
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 101, "ep 1"])
def test_the_task_names_an_endpoint_by_its_id(bad: str) -> None:
    with pytest.raises(ValidationError, match="serverless_endpoint_id"):
        JobTask(job_id="j1", index=0, sidecar="/x.jsonl", serverless_endpoint_id=bad)
