"""Shared fixtures. Real components only: real sockets on 127.0.0.1, the real
ONNX model, real worker processes (see tests/integration)."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "samples" / "models" / "yolox_nano_416.onnx"
STADTMITTE = ROOT / "samples" / "mot15" / "TUD-Stadtmitte"
CAMPUS = ROOT / "samples" / "mot15" / "TUD-Campus"
CLIP = STADTMITTE / "TUD-Stadtmitte.mp4"
FILE_ROOTS_ENV = "FRAMERELAY_INGEST_FILE_ROOTS"

REDIS_URL = "redis://127.0.0.1:6379/0"
"""The loopback Redis that scripts/services.sh starts (tests that need a server of their
own start :class:`tests.support.servers.RedisServer`)."""

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


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """``async def`` tests run on asyncio: anyio's pytest plugin in auto mode
    (``anyio_mode`` in pyproject.toml) runs every one, no ``asyncio.run`` wrapper needed.
    Module scope (anyio's own default) lets a module-scoped async fixture serve the
    module's tests; the event loop lives as long as the async fixtures and tests using
    it, and a test without such a fixture still gets a loop of its own."""
    return "asyncio"


@dataclass(frozen=True)
class RedisSpace:
    """A client of the loopback Redis and a key prefix no other test uses."""

    client: Redis
    prefix: str


@pytest.fixture
async def redis_space() -> AsyncIterator[RedisSpace]:
    """The loopback Redis under a fresh prefix; the prefix's keys are deleted afterwards."""
    client = Redis.from_url(REDIS_URL)
    space = RedisSpace(client, f"test:{uuid.uuid4().hex[:8]}")
    try:
        yield space
    finally:
        keys = [k async for k in client.scan_iter(f"{space.prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules holding a ``slow`` test run first (each module keeps its order): with
    pytest-xdist's ``--dist loadgroup`` (scripts/test.sh) the long scenarios start while
    the many short tests fill the other workers, instead of ending the run alone."""
    heavy = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in heavy)
