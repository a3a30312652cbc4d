"""Worker processes (local, real models) and an in-process ingest with its API over httpx's
ASGI transport, for failover tests: a worker can be frozen (SIGSTOP) and resumed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from framerelay.launcher import LocalWorker
from framerelay.results import ResultRecord
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

ENV = {"FRAMERELAY_WORKER_SNAPSHOT_INTERVAL_S": "0.2", "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def workers(secret: str, *ids: str) -> Iterator[dict[str, LocalWorker]]:
    """Worker processes (started in parallel); always resumed and stopped at the end."""
    procs = {
        w: LocalWorker(secret, worker_id=w, args=["--model", str(MODEL)], env=ENV) for w in ids
    }
    try:
        with ThreadPoolExecutor(len(ids)) as pool:
            list(pool.map(lambda w: w.start(timeout_s=120 * TIMEOUT_FACTOR), procs.values()))
        yield procs
    finally:
        for w in procs.values():
            signal_worker(w, signal.SIGCONT)
            w.stop()


def signal_worker(worker: LocalWorker, sig: signal.Signals) -> None:
    if worker.proc is not None and worker.proc.poll() is None:
        os.kill(worker.proc.pid, sig)


REGISTRY: dict[int, CollectorRegistry] = {}
"""The metrics registry of each running service (by id)."""


def metric(service: IngestService, name: str, **labels: str) -> float | None:
    return REGISTRY[id(service)].get_sample_value(name, labels)


@contextlib.asynccontextmanager
async def ingest(
    secret: str, tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[IngestService, httpx.AsyncClient, list[tuple[float, ResultRecord]]]]:
    """The ingest service and its API (in process); results with their arrival time."""
    values: dict[str, Any] = {
        "worker_url": f"ws://127.0.0.1:{free_port()}/v1/tunnel",
        "token_secrets": secret,
        "store_path": tmp_path / "streams.json",
        **overrides,
    }
    service = IngestService(IngestSettings(**values))
    got: list[tuple[float, ResultRecord]] = []
    service.bus.tap(lambda r: got.append((time.monotonic(), r)))
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    scopes = ["streams:read", "streams:write", "routing:write"]
    headers = {"Authorization": f"Bearer {mint(secret, scopes, 'ingest', ttl=600)}"}
    registry = REGISTRY[id(service)] = CollectorRegistry()
    transport = httpx.ASGITransport(app=create_app(service, registry=registry))
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://ingest", headers=headers
        ) as http:
            await wait_until_async(service.started.is_set, 10, "ingest start")
            yield service, http, got
            assert not run.done(), "the ingest service ended"
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        REGISTRY.pop(id(service), None)
