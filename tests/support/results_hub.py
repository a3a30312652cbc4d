"""Test rig for results delivery: private redis-servers, an in-process hub, helpers (records
read back from JSONL: :func:`load_records`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from framerelay.auth import AuthGuard
from framerelay.results import ResultRecord
from ingest.auth import api_guard
from ingest.hub import ResultHub, results_router
from ingest.server import api_server
from ingest.settings import IngestSettings
from tests.conftest import CLIP, ROOT, service_env
from tests.support.waiting import wait_until_async


def kill_all(*procs: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Kill whatever of ``procs`` still runs (test teardown), and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def camera_and_recorder(
    stream: str, redis_url: str, tmp_path: Path
) -> tuple[subprocess.Popen[str], subprocess.Popen[bytes]]:
    """A live HTTP camera playing the sample clip (tests/results/camera.py) and the recording
    worker recording it as ``stream`` into ``tmp_path/rec`` (its output: ``tmp_path/record.log``),
    reading results from the Redis at ``redis_url``."""
    camera = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/results/camera.py"), "--clip", str(CLIP)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert camera.stdout is not None
    source = f"http://127.0.0.1:{json.loads(camera.stdout.readline())['port']}/live.ts"
    env = service_env(FRAMERELAY_REDIS_URL=redis_url, FRAMERELAY_RECORD_MATCH_WINDOW_S="1")
    out_dir = str(tmp_path / "rec")
    args = ["--stream", stream, "--source", source, "--out", out_dir, "--segment-s", "2"]
    with (tmp_path / "record.log").open("wb") as out:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "framerelay", "record", *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )
    return camera, recorder


def p99(values: list[float]) -> float:
    return float(np.percentile(np.asarray(values), 99))


@contextlib.asynccontextmanager
async def serving(hub: ResultHub, settings: IngestSettings) -> AsyncIterator[str]:
    """The hub on a real loopback socket in this event loop; yields ``ws://.../v1/results``
    (``wss://`` when ``settings`` has an API certificate)."""
    app = FastAPI()
    app.include_router(results_router(hub))
    server, sock = api_server(app, settings)
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    scheme = "wss" if settings.api_tls_cert is not None else "ws"
    try:
        await wait_until_async(lambda: server.started, 10, "uvicorn started")
        yield f"{scheme}://127.0.0.1:{port}/v1/results"
    finally:
        server.should_exit = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await task
        sock.close()


def hub_guard(secret: str, *, leeway_s: float = 30.0, max_failures: int = 1000) -> AuthGuard:
    """The ingest API's gate for HS256 ``secret`` (tokens: ``mint(secret, ..., "ingest")``)."""
    settings = IngestSettings(
        token_secrets=secret, token_leeway_s=leeway_s, auth_max_failures=max_failures
    )
    return api_guard(settings, CollectorRegistry())


def load_records(path: Path) -> list[ResultRecord]:
    return [ResultRecord.model_validate_json(line) for line in path.read_text().splitlines()]
