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

TIMEOUT_FACTOR = float(os.environ.get("FRAMERELAY_TIMEOUT_FACTOR", "1.0"))
"""Scale every timing-sensitive wait in the tests (slow CI machines: 2-3)."""


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
