"""``LocalWorker(remove_log=True)`` (the demo's): the temporary log of a worker that
exited cleanly is removed at stop; the log of one that failed stays, as does any log
without the option (the local provider's pods, the tests that read logs after a stop)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from framerelay.errors import ConfigError
from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, TIMEOUT_FACTOR

ARGS = ["--model", str(MODEL), "--threads", "1"]


def _worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], *, remove_log: bool = False
) -> LocalWorker:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # tempfile reads it once per process...
    monkeypatch.setattr("tempfile.tempdir", None)  # ...so forget the cached choice
    return LocalWorker(secrets.token_urlsafe(32), args=args, remove_log=remove_log)


def test_a_clean_exit_removes_the_log_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed = _worker(tmp_path, monkeypatch, ARGS, remove_log=True)
    kept = _worker(tmp_path, monkeypatch, ARGS)
    for w in (removed, kept):
        assert w.log_path.parent == tmp_path
        w.start(120 * TIMEOUT_FACTOR)
        assert w.stop() == 0
    assert not removed.log_path.exists()
    assert kept.log_path.exists()


def test_the_log_of_a_worker_that_failed_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ["--model", str(tmp_path / "none.onnx")]
    failed = _worker(tmp_path, monkeypatch, bad, remove_log=True)
    with pytest.raises(ConfigError, match="exited"):
        failed.start(60 * TIMEOUT_FACTOR)
    assert failed.log_path.exists() and failed.log_path.read_text()
