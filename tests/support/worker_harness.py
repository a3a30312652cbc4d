"""An in-process worker on a real loopback socket, for protocol-level tests, and an
ingest-side tunnel client streaming to it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from framerelay.results import ResultRecord
from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.server import Worker
from gpu_worker.settings import WorkerSettings
from ingest.settings import StreamConfig
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient, supervise
from tests.conftest import CLIP, MODEL
from tests.support.auth import mint


@contextlib.asynccontextmanager
async def running_worker(  # secret None: overrides give tunnel_keys
    secret: str | None, worker_id: str = "gpu-a", **overrides: Any
) -> AsyncIterator[tuple[Worker, str]]:
    settings = WorkerSettings(
        host="127.0.0.1",
        port=0,
        worker_id=worker_id,
        token_secrets=secret,
        detector=OnnxDetectorSettings(model=MODEL, threads=1),
        warmup_runs=1,
        **overrides,
    )
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


@contextlib.asynccontextmanager
async def streaming(
    url: str, tok: str, records: list[ResultRecord], config: StreamConfig | None = None
) -> AsyncIterator[tuple[TunnelClient, IngestStream]]:
    """A tunnel client with one stream (``config``, default the looped clip at 10 fps)
    flowing to ``url``; stopped and joined on exit."""
    client = TunnelClient(url, lambda: tok, records.append, reconnect_max_s=0.5)
    config = config or StreamConfig(id="cam", url=str(CLIP), fps=10, realtime=True, loop=True)
    stream = IngestStream(config, asyncio.get_running_loop(), 2, link_up=client.connected.is_set)
    client.add(stream)
    stream.launch()
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(client, stop))
    try:
        yield client, stream
    finally:
        stream.stop()
        stop.set()
        await asyncio.wait_for(task, 15)
        await asyncio.to_thread(stream.join, 10)
