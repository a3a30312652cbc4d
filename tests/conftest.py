"""Shared fixtures. Real components only: real sockets on 127.0.0.1, the real
ONNX model, real worker processes (see tests/integration)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "samples" / "models" / "yolox_nano_416.onnx"
STADTMITTE = ROOT / "samples" / "mot15" / "TUD-Stadtmitte"
CAMPUS = ROOT / "samples" / "mot15" / "TUD-Campus"
CLIP = STADTMITTE / "TUD-Stadtmitte.mp4"
FILE_ROOTS_ENV = "FRAMERELAY_INGEST_FILE_ROOTS"

TIMEOUT_FACTOR = float(os.environ.get("FRAMERELAY_TIMEOUT_FACTOR", "1.0"))
"""Scale every timing-sensitive wait in the tests (slow CI machines: 2-3)."""


def service_env(**extra: str) -> dict[str, str]:
    """The environment of a service process a test starts: this one without its
    FRAMERELAY_ settings, but with the API's file roots (set for the session below), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
    if FILE_ROOTS_ENV in os.environ:
        env[FILE_ROOTS_ENV] = os.environ[FILE_ROOTS_ENV]
    return env | extra


@pytest.fixture(scope="session", autouse=True)
def _api_file_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Streams added over the API may read files under the test folders and samples/
    (``FRAMERELAY_INGEST_FILE_ROOTS``; an ingest's default is none): in-process settings
    and the ingests tests start with this environment. tests/security/test_source_urls.py
    sets ``file_roots`` itself."""
    roots = [str(tmp_path_factory.getbasetemp()), str(ROOT / "samples")]
    before = os.environ.get(FILE_ROOTS_ENV)
    os.environ[FILE_ROOTS_ENV] = os.pathsep.join(roots)
    yield
    if before is None:
        os.environ.pop(FILE_ROOTS_ENV, None)
    else:
        os.environ[FILE_ROOTS_ENV] = before


@pytest.fixture(scope="session")
def secret() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="session")
def local_worker(secret: str) -> Iterator[object]:
    """One real worker process for the session (CPU, the sample model)."""
    from framerelay.launcher import LocalWorker

    worker = LocalWorker(secret, worker_id="test-worker", args=["--model", str(MODEL)])
    worker.start(timeout_s=120 * TIMEOUT_FACTOR)
    yield worker
    worker.stop()
