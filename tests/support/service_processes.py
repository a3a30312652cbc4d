"""``framerelay ingest`` and ``framerelay orchestrator`` as real processes for the metrics
tests (their environment without FRAMERELAY_ settings, a log file each), each ended and its
Redis keys dropped at the end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from redis import Redis
from websockets.asyncio.client import connect

from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.servers import free_port

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "framerelay", *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_http(url: str, what: str, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:]
    pytest.fail(f"{what} did not answer {url} in {timeout_s} s; its log ends:\n{tail}")


def end_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20 * TIMEOUT_FACTOR)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def drop_keys(prefix: str) -> None:
    redis = Redis()
    for key in redis.scan_iter(match=prefix + "*"):
        redis.delete(key)
    redis.close()


@asynccontextmanager
async def running_ingest(
    worker_url: str, secret: str, folder: Path, name: str, *extra: str
) -> AsyncIterator[str]:
    """A ``framerelay ingest`` process on the sample clip (Redis on, results received);
    yields its base URL. ``extra``: more options (e.g. ``--latency-slo-ms 50``)."""
    port, prefix = free_port(), f"test-{name}-{os.getpid()}"
    env = {
        **BASE_ENV,
        "FRAMERELAY_TOKEN_SECRETS": secret,
        "FRAMERELAY_REDIS_URL": "redis://127.0.0.1:6379/0",
        "FRAMERELAY_INGEST_RESULTS__REDIS_PREFIX": prefix,
    }
    log = folder / "ingest.log"
    proc = spawn(
        [
            "ingest",
            "--worker-url",
            worker_url,
            "--worker-id",
            "test-worker",
            "--source",
            str(CLIP),
            "--fps",
            "5",
            "--realtime",
            "--loop",
            *extra,
            "--api-port",
            str(port),
        ],
        env,
        log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/readyz", "the ingest", log)
        await _receive_results(base, secret)
        yield base
    finally:
        end_process(proc)
        drop_keys(prefix)


async def _receive_results(base: str, secret: str, count: int = 2) -> None:
    """Subscribe and take ``count`` results: the hub's delivery histogram has samples."""
    url = base.replace("http://", "ws://") + "/v1/results?stream=stream-1"
    token = mint(secret, ["results:stream-1"], "ingest")
    async with connect(
        url, proxy=None, additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        seen = 0
        while seen < count:
            message = json.loads(await asyncio.wait_for(ws.recv(), 30 * TIMEOUT_FACTOR))
            seen += message["type"] == "result"
