"""`framerelay worker` and `framerelay ingest` as separate processes: the ingest
serves results on its WebSocket API and stream state over REST."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay.launcher import LocalWorker
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ingest(local_worker: LocalWorker, secret: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FRAMERELAY_TOKEN_SECRETS": secret}
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "ingest", "--worker-url", local_worker.url,
         "--worker-id", "test-worker", "--source", str(CLIP), "--fps", "5", "--realtime", "--loop",
         "--api-port", str(port)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 30, "the ingest's /healthz answering 200", every_s=0.2)
    except TimeoutError:
        proc.kill()
        proc.communicate(timeout=20)
        raise
    yield base
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out[-2000:]
    assert secret not in out


def test_streams_api_reports_state_and_counters(ingest: str, secret: str) -> None:
    assert httpx.get(f"{ingest}/v1/streams").status_code == 401
    headers = {"Authorization": f"Bearer {mint(secret, ['streams:read'], 'ingest')}"}

    def with_results() -> dict[str, Any] | None:
        (stream,) = httpx.get(f"{ingest}/v1/streams", headers=headers).json()
        return cast("dict[str, Any]", stream) if stream["results"] > 0 else None

    stream = wait_until(with_results, 20, "a result of stream-1", every_s=0.2)
    assert stream["id"] == "stream-1"
    assert stream["state"] == "RUNNING"
    assert stream["results"] > 0 and stream["decode_error"] == 0


async def test_results_websocket_needs_a_results_token(ingest: str, secret: str) -> None:
    url = ingest.replace("http://", "ws://") + "/v1/results?stream=stream-1"

    with pytest.raises(InvalidStatus):
        async with connect(url, proxy=None):
            pass
    other = mint(secret, ["results:other"], "ingest")
    with pytest.raises(InvalidStatus):
        async with connect(
            url, proxy=None, additional_headers={"Authorization": f"Bearer {other}"}
        ):
            pass
    good = mint(secret, ["results:stream-1"], "ingest")
    async with connect(
        url, proxy=None, additional_headers={"Authorization": f"Bearer {good}"}
    ) as ws:
        while True:  # the hub says "subscribed" first, then sends results
            message = json.loads(await asyncio.wait_for(ws.recv(), 20 * TIMEOUT_FACTOR))
            if message["type"] == "result":
                record: dict[str, object] = dict(message)
                break
    assert record["stream_id"] == "stream-1"
    assert {"epoch", "pts", "time_base", "pts_time", "captured_at", "detections"} <= set(record)
