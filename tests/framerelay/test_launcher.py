"""A local worker gets an explicit environment: none of this process's secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from framerelay.launcher import LocalWorker, child_env
from tests.conftest import MODEL

pytestmark = pytest.mark.integration


def _proc_file(pid: int, name: str) -> list[str]:
    return Path(f"/proc/{pid}/{name}").read_bytes().decode().split("\0")


def test_child_gets_the_basics_and_what_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAMERELAY_SIGNING_KEYS", '{"keys": "private"}')
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("FRAMERELAY_WORKER_TEST_HOOKS", "true")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = child_env({"FRAMERELAY_WORKER_WORKER_ID": "w"})
    assert env["PATH"] and env["LC_ALL"] == "C.UTF-8" and env["FRAMERELAY_WORKER_WORKER_ID"] == "w"
    for name in (
        "FRAMERELAY_SIGNING_KEYS",
        "AWS_SECRET_ACCESS_KEY",
        "FRAMERELAY_WORKER_TEST_HOOKS",
    ):
        assert name not in env


def test_worker_process_environment_and_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "the-shared-secret-of-this-test"
    monkeypatch.setenv("FRAMERELAY_SIGNING_KEYS", '{"keys": "private"}')
    monkeypatch.setenv("FRAMERELAY_ORCH_RUNPOD__API_KEY", "rp-api-key-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("FRAMERELAY_WORKER_TEST_FAULT", "hang_inference_after:0")
    with LocalWorker(secret, worker_id="env-test", args=["--model", str(MODEL)]) as worker:
        assert worker.proc is not None
        environ = _proc_file(worker.proc.pid, "environ")
        cmdline = " ".join(_proc_file(worker.proc.pid, "cmdline"))
    names = {e.partition("=")[0] for e in environ if e}
    assert "FRAMERELAY_SIGNING_KEYS" not in names
    assert "FRAMERELAY_ORCH_RUNPOD__API_KEY" not in names
    assert "AWS_SECRET_ACCESS_KEY" not in names and "FRAMERELAY_WORKER_TEST_FAULT" not in names
    assert f"FRAMERELAY_TOKEN_SECRETS={secret}" in environ
    assert secret not in cmdline and "rp-api-key-value" not in cmdline


def test_a_worker_that_closes_stdout_then_exits_is_reported_as_exited(tmp_path: Path) -> None:
    """Regression: the reader saw EOF before the process was reaped, so a worker failing
    at once (but slowly, on a loaded machine) was reported as 'did not become ready'."""
    import subprocess
    import sys

    from framerelay.errors import ConfigError

    log = tmp_path / "worker.log"
    log.write_text("framerelay: error: cannot load the model: /nonexistent.onnx\n")
    worker = LocalWorker(None, log_path=log)
    slow_exit = "import os, sys, time; os.close(1); time.sleep(1.5); sys.exit(2)"
    worker.proc = subprocess.Popen(
        [sys.executable, "-c", slow_exit], stdout=subprocess.PIPE, text=True
    )
    with pytest.raises(ConfigError) as info:
        worker._read_announce(timeout_s=60)
    assert "exited (code 2) before it was ready: cannot load the model" in str(info.value)
