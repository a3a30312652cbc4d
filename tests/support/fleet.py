"""A whole fleet on this machine for the fault tests: the orchestrator (in
process, real Redis under a unique key prefix), the local provider (real
worker processes), and a real ingest service behind its real HTTP API (the
orchestrator places streams through ``PUT /v1/streams/{id}/worker``, with a
token the ingest verifies).

Keys as in production: on one host (the local provider) the ingest and the
orchestrator share an HS256 secret, which local workers get too; with a
remote provider (the RunPod contract server) they share an Ed25519 key set
and pods get only its public half and their own certificate, which the
ingest verifies against the orchestrator's CA."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from redis.asyncio import Redis

from deploy.ca import PodCA
from deploy.models import PodSpec
from deploy.providers.base import Provider
from deploy.providers.local import LocalProvider
from deploy.service import Orchestrator
from deploy.settings import LocalSettings, OrchestratorSettings, TierConfig
from framerelay.auth import KeySet
from framerelay.results import ResultRecord
from ingest.app import create_app
from ingest.registry import StreamRegistry
from ingest.service import IngestService
from ingest.settings import IngestSettings
from tests.conftest import MODEL, REDIS_URL, TIMEOUT_FACTOR

SNAPSHOT_S = 0.2
"""Workers' snapshot interval: a re-homed track survives if snapshot age + outage
stays under the tracker's max_lost_s (1.2 s by default)."""


@dataclass
class Fleet:
    orch: Orchestrator
    provider: LocalProvider
    pool: StreamRegistry
    records: list[ResultRecord] = field(default_factory=list)

    def results_for(self, stream: str) -> list[ResultRecord]:
        return [r for r in self.records if r.stream_id == stream]


def settings_for(
    secret: str, ca_dir: Path, *, keys: KeySet | None = None, **over: Any
) -> OrchestratorSettings:
    """Local fleet settings, the pod CA in ``ca_dir``; ``keys`` (an Ed25519 set) instead of
    ``secret`` for remote pods."""
    auth: dict[str, Any] = (
        {"signing_keys": keys.to_json()} if keys is not None else {"token_secrets": secret}
    )
    base: dict[str, Any] = {
        "provider": "local", "redis_url": REDIS_URL, **auth,
        "ca_dir": ca_dir,
        "key_prefix": f"test-fleet-{secrets.token_hex(4)}:", "tick_s": 0.5, "lease_ttl_s": 5,
        "canary_interval_s": 2, "canary_timeout_s": 8 * TIMEOUT_FACTOR, "heartbeat_timeout_s": 2,
        "unhealthy_after": 2, "startup_grace_s": 120 * TIMEOUT_FACTOR,
        "local": LocalSettings(model=MODEL, threads=1),
        "tiers": [TierConfig(name="ondemand", min_warm=3, max_workers=3, capacity_fps=12)],
    }  # fmt: skip
    return OrchestratorSettings(**{**base, **over})


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def running_fleet(
    settings: OrchestratorSettings,
    *,
    env_hook: Callable[[PodSpec], dict[str, str]] | None = None,
    provider: Provider | None = None,
    ingest_over: dict[str, Any] | None = None,
) -> AsyncIterator[Fleet]:
    """``ingest_over``: more ingest settings (e.g. ``redis_url`` for job tasks)."""
    records: list[ResultRecord] = []
    # No default worker: every stream is placed by the orchestrator. Same keys as it; pods'
    # certificates are verified against its CA (made here first: the ingest loads it).
    ca = PodCA.load_or_create(settings.ca_dir)
    ingest = IngestService(
        IngestSettings(
            token_secrets=settings.token_secrets, signing_keys=settings.signing_keys,
            worker_url="ws://127.0.0.1:9/none", tls_ca=ca.cert_path, **(ingest_over or {}),
        )
    )  # fmt: skip
    ingest.bus.tap(records.append)
    ingest_stop = asyncio.Event()
    ingest_task = asyncio.create_task(ingest.run(ingest_stop))
    server, serve_task, ingest_url = await _serve(create_app(ingest))
    settings = settings.model_copy(update={"ingest_url": ingest_url})
    local = LocalProvider(settings.local, env_hook=env_hook)
    orch = Orchestrator(settings, provider=provider or local)
    orch.fleet.worker_env = {"FRAMERELAY_WORKER_SNAPSHOT_INTERVAL_S": str(SNAPSHOT_S)}
    stop = asyncio.Event()
    loop = asyncio.create_task(orch.run(stop))
    try:
        yield Fleet(orch, local, ingest.registry, records)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)
        ingest_stop.set()
        await asyncio.wait_for(ingest_task, 30)
        await orch.store.clear()
        await orch.aclose()
        server.should_exit = True
        await asyncio.wait_for(serve_task, 10)


async def resumed_sessions(http_url: str) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"{http_url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("framerelay_worker_sessions_resumed_total"):
            return int(float(line.split()[-1]))
    return 0


async def clear_prefix(prefix: str) -> None:
    redis = Redis.from_url(REDIS_URL)
    async for key in redis.scan_iter(match=prefix + "*"):
        await redis.delete(key)
    await redis.aclose()
