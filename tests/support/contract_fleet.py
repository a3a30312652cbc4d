"""An orchestrator on the RunPod API v2 contract server (:mod:`bench.rig.runpod_v2_contract`)
with a fake clock, driven pass by pass, and what its tests share: the GPU and tiers they
run, a prober with a fixed canary round trip."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from redis.asyncio import Redis

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.clock import FakeClock
from deploy.health import Probe, StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.providers.runpod.provider import RunPodProvider
from deploy.service import Orchestrator
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig
from tests.support.auth import ed_keys

GPU = "NVIDIA RTX A4000"
TICK_S = 2.0


TIERS = (
    TierConfig(name="ondemand", min_warm=1, max_workers=4, capacity_fps=20, gpu_types=(GPU,)),
    TierConfig(
        name="community",
        max_workers=4,
        capacity_fps=20,
        gpu_types=(GPU,),
        cloud_types=("COMMUNITY",),
    ),
)
"""The default of :func:`fleet_on_contract`: on-demand (one warm) and community, 4 workers each."""


@asynccontextmanager
async def fleet_on_contract(
    state: ContractServer, clock: FakeClock, tiers: tuple[TierConfig, ...] = TIERS
) -> AsyncIterator[Orchestrator]:
    ca_dir = tempfile.TemporaryDirectory(prefix="framerelay-ca-test-")
    settings = OrchestratorSettings(
        provider="runpod",
        tiers=list(tiers),
        key_prefix=f"test-nocap-{state.api_key}:",
        signing_keys=SecretStr(ed_keys().to_json()),
        ca_dir=Path(ca_dir.name) / "ca",
        tick_s=TICK_S,
        create_backoff_s=10,
        timezone="UTC",
        create_backoff_max_s=40,
        drain_timeout_s=0,
    )
    with ca_dir, running_runpod_v2(state) as base:
        provider = RunPodProvider(  # the catalog's reuse and grace on the fake clock too
            RunPodSettings(api_key=SecretStr(state.api_key), base_url=base, backoff_s=0.01),
            clock=clock.now,
        )
        orch = Orchestrator(
            settings,
            provider=provider,
            prober=StatusProber(20),
            ingest=NullIngestLink(),
            clock=clock,
            redis=Redis.from_url("redis://127.0.0.1:6379/0"),
        )
        try:
            yield orch
        finally:
            await orch.store.clear()
            await orch.aclose()
    assert state.violations == [] and state.client_errors == [] and not state.key_in_url


WARM_TIERS = (  # standard streams go to the community cloud (cheaper); on-demand keeps one warm
    TierConfig(name="ondemand", min_warm=1, max_workers=2, capacity_fps=20, gpu_types=(GPU,)),
    TierConfig(
        name="community",
        max_workers=3,
        capacity_fps=20,
        gpu_types=(GPU,),
        cloud_types=("COMMUNITY",),
    ),
)


async def passes(orch: Orchestrator, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        await orch.fleet.tick()
        await orch.sample_history()
        clock.advance(TICK_S)


def community_pods(state: ContractServer) -> list[str]:
    return sorted(pid for pid, p in state.pods.items() if p.name.startswith("fr-community"))


def stream_spec(sid: str) -> Any:
    from deploy.models import StreamSpec

    return StreamSpec(id=sid, url="rtsp://cam/x", fps=5)


CANARY_MS = 42.5


class TimedProber(StatusProber):
    """The provider's status, with a canary round trip of :data:`CANARY_MS`."""

    def __init__(self) -> None:
        super().__init__(20)

    async def probe(
        self,
        name: str,
        tunnel_url: str,
        http_url: str,
        *,
        canary: bool,
        tls_name: str | None = None,
    ) -> Probe:
        probe = await super().probe(name, tunnel_url, http_url, canary=canary)
        return dataclasses.replace(probe, canary_ms=CANARY_MS) if probe.canary_ok else probe
