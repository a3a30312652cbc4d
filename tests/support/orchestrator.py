"""Helpers of the orchestrator tests: keys, settings, a real API server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from deploy.settings import OrchestratorSettings
from framerelay.auth import KeySet
from tests.conftest import REDIS_URL
from tests.support.auth import ed_keys
from tests.support.waiting import wait_until, wait_until_async

MODEL_REGISTRY = """
[models.vehicles]
file = "vehicles.onnx"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = { image = "kitti.jpg", expect = { car = 1 } }

[models.trucks]
file = "vehicles.onnx"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = { image = "kitti.jpg", expect = { truck = 1 } }
"""
"""A ``models.toml`` of two models on one file (vehicles, trucks: the same classes, canaries
that expect a car and a truck), as the orchestrator reads it."""


def jwks(keys: KeySet) -> SecretStr:
    return SecretStr(keys.to_json())


def orch_settings(tmp: Path, keys: KeySet | None = None, **over: Any) -> OrchestratorSettings:
    """Settings under a unique Redis prefix, the pod CA in ``tmp``; Ed25519 keys by default."""
    base: dict[str, Any] = {
        "redis_url": REDIS_URL, "key_prefix": f"test-orch-{secrets.token_hex(4)}:",
        "signing_keys": jwks(keys or ed_keys()), "ca_dir": tmp / "ca", "timezone": "UTC",
        "tiers": [{"name": "ondemand", "max_workers": 0}],
        # jobs' progress keys too: another test's ingest may write the same job id
        "jobs": {"redis_prefix": f"test-jobs-{secrets.token_hex(4)}"},
    }  # fmt: skip
    return OrchestratorSettings(**{**base, **over})


@contextmanager
def serving(app: FastAPI, **config: Any) -> Iterator[str]:
    """Serve ``app`` on a free 127.0.0.1 port in a thread; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", **config)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(
        lambda: server.started or not thread.is_alive(), 10, "API server to start", every_s=0.01
    )
    if not server.started:
        raise RuntimeError("API server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    scheme = "https" if "ssl_certfile" in config else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@asynccontextmanager
async def serving_here(app: FastAPI, **config: Any) -> AsyncIterator[str]:
    """Serve ``app`` on this event loop (shares the orchestrator's Redis client)."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", **config)
    )
    task = asyncio.create_task(server.serve())
    await wait_until_async(
        lambda: server.started or task.done(), 10, "API server to start", every_s=0.025
    )
    assert server.started, "API server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    scheme = "https" if "ssl_certfile" in config else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
