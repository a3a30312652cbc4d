"""The job driver in the real orchestrator loop: a batch job opens pods on a batch-only
community-cloud tier from zero (one per task up to max_parallel), starts the next task
when its ingest marks one done, survives an orchestrator restart and a pod lost with its
host, charges its share of the pods, and the tier drains back to zero once the queue is
empty.

The real fleet (scaler, placement, drains) against the RunPod API v2 contract server and a real
Redis, with a fake clock; pods run nothing (health from the provider's status) and the
ingest's side of the contract (TaskProgress in Redis) is written here."""

from __future__ import annotations

import datetime as dt
import secrets
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.clock import FakeClock
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.jobs_api import new_job
from deploy.providers.runpod.provider import RunPodProvider
from deploy.service import Orchestrator
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig
from framerelay.jobs import JobSpec, TaskProgress, progress_key
from tests.support.auth import ed_keys

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A4000"
TICK_S = 2.0
TIERS = (
    TierConfig(name="ondemand", min_warm=0, max_workers=2, capacity_fps=20, gpu_types=(GPU,)),
    TierConfig(name="batch", batch_only=True, min_warm=0, max_workers=4,
               gpu_types=(GPU,), cloud_types=("COMMUNITY",)),
)  # fmt: skip


def settings(prefix: str, ca: Path) -> OrchestratorSettings:
    return OrchestratorSettings(
        provider="runpod", tiers=list(TIERS), key_prefix=prefix, timezone="UTC",
        signing_keys=SecretStr(ed_keys().to_json()), ca_dir=ca, tick_s=TICK_S,
        drain_timeout_s=30, jobs={"redis_prefix": prefix + "ingest"},
    )  # fmt: skip


@asynccontextmanager
async def orchestrator(
    state: ContractServer, clock: FakeClock, base: str, s: OrchestratorSettings
) -> AsyncIterator[Orchestrator]:
    provider = RunPodProvider(
        RunPodSettings(api_key=SecretStr(state.api_key), base_url=base, backoff_s=0.01),
        clock=clock.now,
    )
    orch = Orchestrator(
        s, provider=provider, prober=StatusProber(20), ingest=NullIngestLink(), clock=clock,
        redis=Redis.from_url("redis://127.0.0.1:6379/0"),
    )  # fmt: skip
    try:
        yield orch
    finally:
        await orch.store.release(orch.owner)
        await orch.aclose()


async def batch_pods(orch: Orchestrator) -> int:
    return sum(p.tier == "batch" for p in (await orch.store.pods()).values())


async def mark(orch: Orchestrator, k: int, state: str, frames: int = 30) -> None:
    key = progress_key(orch.settings.jobs.redis_prefix, "night", k)
    said = TaskProgress.model_validate({"state": state, "frames_done": frames, "frames_total": 30})
    await orch.redis.set(key, said.model_dump_json())


async def test_a_job_scales_a_batch_tier_from_zero_and_back(tmp_path: Path) -> None:
    files = []
    for k in range(3):
        files.append(tmp_path / f"seg-{k}.mp4")
        files[-1].write_bytes(b"")
    spec = JobSpec(id="night", inputs=[str(f) for f in files], max_parallel=2)

    async def passes(orch: Orchestrator, clock: FakeClock, n: int, seen: list[int]) -> None:
        for _ in range(n):
            assert await orch.step()
            clock.advance(TICK_S)
            seen.append(await batch_pods(orch))

    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    prefix = f"test-jobs-{secrets.token_hex(4)}:"
    seen: list[int] = []
    with tempfile.TemporaryDirectory() as ca, running_runpod_v2(state) as base:
        s = settings(prefix, Path(ca) / "ca")
        async with orchestrator(state, clock, base, s) as orch:
            await passes(orch, clock, 2, seen)
            assert seen == [0, 0]  # min_warm 0: nothing before a job
            assert await orch.jobs.submit(await new_job(orch, spec))
            await passes(orch, clock, 3, seen)
            assert await batch_pods(orch) == 2  # one worker per task, max_parallel 2
            placed = await orch.store.assignments()
            assert sorted(placed) == ["job-night-0", "job-night-1"]
            assert all(w.startswith("fr-batch-") for w in placed.values())
            await mark(orch, 0, "running", 10)
            await mark(orch, 1, "running", 12)
            await passes(orch, clock, 2, seen)
        # a restart: a new orchestrator (same Redis) carries on with the job
        async with orchestrator(state, clock, base, s) as orch:
            try:
                await mark(orch, 0, "done")
                await passes(orch, clock, 2, seen)
                assert sorted(await orch.store.assignments()) == ["job-night-1", "job-night-2"]
                lost = next(p for p in state.pods.values() if p.name.startswith("fr-batch"))
                state.vanish(lost.id)  # its host is lost
                await passes(orch, clock, 3, seen)
                assert orch.fleet.counters["vanished"] == 1
                assert sorted(await orch.store.assignments()) == ["job-night-1", "job-night-2"]
                await mark(orch, 1, "done")
                await mark(orch, 2, "done")
                await passes(orch, clock, 4, seen)
                rec = await orch.jobs.get("night")
                assert rec is not None and rec.state == "done"
                assert await orch.store.streams() == {}
                await passes(orch, clock, 3, seen)
                assert await batch_pods(orch) == 0, seen  # drained back to zero
                (view,) = await orch.jobs.many(["night"])
                took = (view.finished_at or 0) - (view.started_at or 0)
                print(
                    f"\nbatch pods per pass: {seen}; job cost ${view.cost_usd:.5f}, "
                    f"{view.pod_seconds:.0f} pod-s, {took:.0f} s"
                )
                assert view.cost_usd > 0 and view.pod_seconds > 0
                assert max(seen) == 2 and seen[-1] == 0
            finally:
                await orch.store.clear()
    assert state.violations == [] and state.client_errors == [] and not state.key_in_url
