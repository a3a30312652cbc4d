"""An in-process worker on a real loopback socket, for protocol-level tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.server import Worker
from gpu_worker.settings import WorkerSettings
from tests.conftest import MODEL
from tests.support.auth import mint


@contextlib.asynccontextmanager
async def running_worker(  # secret None: overrides give tunnel_keys
    secret: str | None, worker_id: str = "gpu-a", **overrides: Any
) -> AsyncIterator[tuple[Worker, str]]:
    settings = WorkerSettings(
        host="127.0.0.1", port=0, worker_id=worker_id, token_secrets=secret,
        detector=OnnxDetectorSettings(model=MODEL, threads=1), warmup_runs=1, **overrides,
    )  # fmt: skip
    worker = Worker(settings)
    host, port = await worker.start()
    stop = asyncio.Event()
    task = asyncio.create_task(worker.serve_forever(stop))
    try:
        yield worker, f"{worker.scheme}://{host}:{port}/v1/tunnel"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def token(
    secret: str, scope: str = "worker:gpu-a", ttl: float = 60, now: float | None = None
) -> str:
    return mint(secret, scope, "worker", ttl, now=now)


async def wait_until(predicate: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``predicate`` until true; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout_s} s")
        await asyncio.sleep(0.05)
