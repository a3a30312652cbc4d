"""Acceptance (issue 18, jobs): a batch job over 3 recorded segments on a spot tier with
two preemptions injected finishes, every frame is in the sidecars exactly once, cost and
duration are reported, and the tier scaled from 0 and back to 0.

Everything real: the orchestrator (in process) with the local provider (worker processes
running the ONNX model on CPU), a batch-only spot tier with min_warm 0, a real ingest
behind its HTTP API running the task streams, real Redis. The segments are made by the
recorder's segmenter from a 10 fps H.264 clip. A preemption is a SIGKILL of the spot pod
serving the job (the local provider's spot pods then show EXITED: the fleet's
``preempted``), while the task is mid-way. The expected frames are every frame's PTS of
each segment, decoded independently here with PyAV (the job keeps every frame)."""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from pathlib import Path
from typing import Any

import av
import pytest

from deploy.jobs import JobView, job_view
from deploy.jobs_api import new_job
from deploy.settings import LocalSettings, TierConfig
from framerelay.jobs import JobSpec
from framerelay.schemas import SidecarLine
from ingest.settings import ResultsSettings
from tests.conftest import CLIP, MODEL, REDIS_URL
from tests.support.clip_rig import record_file
from tests.support.fleet import clear_prefix, running_fleet, settings_for
from tests.support.media import ffmpeg
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
SPOT_USD_HR = 0.5
JOB_LIMIT_S = 120.0


def segments(tmp: Path) -> list[Path]:
    """3 recorded segments of a 10 fps H.264 clip (about 60 frames each)."""
    source = tmp / "src.mp4"
    ffmpeg("-stream_loop", "2", "-i", str(CLIP), "-t", "18", "-vf", "scale=320:240,fps=10",
           "-c:v", "libx264", "-preset", "ultrafast", "-g", "10", "-bf", "0",
           "-pix_fmt", "yuv420p", str(source))  # fmt: skip
    index = record_file(tmp / "rec", source, "cam-1", segment_s=6.0)
    done = [tmp / "rec" / "cam-1" / s.name for s in index.segments if s.state != "recording"]
    assert len(done) == 3, [s.name for s in index.segments]
    return done


def decoded_pts(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        return [f.pts for f in container.decode(video=0) if f.pts is not None]


def sidecar_pts(path: Path) -> list[int]:
    lines = [SidecarLine.model_validate_json(raw) for raw in path.read_text().splitlines() if raw]
    return [line.pts for line in lines if line.pts is not None]


async def status(fleet: Any, job_id: str) -> JobView:
    rec = await fleet.orch.jobs.get(job_id)
    assert rec is not None
    return job_view(rec, await fleet.orch.jobs.progress(rec), time.time())


async def serving(fleet: Any, job_id: str, not_on: set[str]) -> str | None:
    """The batch pod serving one of the job's tasks now (none of ``not_on``)."""
    placed = await fleet.orch.store.assignments()
    return next((w for s, w in sorted(placed.items())
                 if s.startswith(f"job-{job_id}-") and w not in not_on), None)  # fmt: skip


async def test_a_job_survives_two_preemptions_scales_from_zero_and_back(
    secret: str, tmp_path: Path
) -> None:
    inputs = segments(tmp_path)
    expected = {p.name: decoded_pts(p) for p in inputs}
    prefix = f"test-job-ingest-{secrets.token_hex(4)}"
    tiers = [
        TierConfig(name="batch", interruptible=True, batch_only=True, min_warm=0, max_workers=2)
    ]
    settings = settings_for(
        secret, tmp_path / "ca", tiers=tiers, jobs={"redis_prefix": prefix},
        local=LocalSettings(model=MODEL, threads=1, spot_price_per_hr=SPOT_USD_HR),
    )  # fmt: skip
    pods_seen: list[int] = []

    async def watch_pods(fleet: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            pods = await fleet.orch.store.pods()
            pods_seen.append(sum(p.tier == "batch" for p in pods.values()))
            await asyncio.sleep(0.2)

    try:
        over = {
            "redis_url": REDIS_URL,
            "results": ResultsSettings(redis_prefix=prefix),
            "job_sidecar_dirs": (tmp_path,),
        }
        async with running_fleet(settings, ingest_over=over) as fleet:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_pods(fleet, stop))
            await asyncio.sleep(1.0)  # a pass or two with no job: no pod
            spec = JobSpec(id="night", inputs=[str(tmp_path / "rec" / "cam-1")], max_parallel=1)
            t0 = time.monotonic()
            assert await fleet.orch.jobs.submit(await new_job(fleet.orch, spec))
            killed: list[str] = []
            for n in (1, 2):  # two preemptions, each while a task is mid-way

                async def progressed(at: int = 15 * n) -> str | None:
                    view = await status(fleet, "night")
                    if view.frames_done < at:
                        return None
                    return await serving(fleet, "night", set(killed))

                victim = await wait_until_async(
                    progressed, 90, f"job progress before preemption {n}", every_s=0.1
                )
                fleet.provider.kill(victim)  # SIGKILL: the spot pod is gone
                killed.append(victim)
            job = await wait_until_async(
                lambda: _ended(fleet), JOB_LIMIT_S, "job finished", every_s=0.1
            )
            took = time.monotonic() - t0
            await wait_until_async(
                lambda: _no_batch_pods(fleet), 30, "batch tier back to 0 pods", every_s=0.1
            )
            await asyncio.sleep(0.5)
            stop.set()
            await watcher
            assert fleet.orch.fleet.counters["preempted"] == 2, dict(fleet.orch.fleet.counters)
    finally:
        await clear_prefix(prefix)
    frames = {
        Path(i).name: sidecar_pts(Path(s)) for i, s in zip(job.inputs, job.sidecars, strict=True)
    }
    dupes = {n: [p for p, c in collections.Counter(v).items() if c > 1] for n, v in frames.items()}
    print(
        f"\njob {job.id}: {job.state} in {job.duration_s} s (submit to end {took:.1f} s), "
        f"frames {job.frames_done}/{job.frames_total}, cost ${job.cost_usd:.5f} "
        f"({job.pod_seconds} pod-s at ${SPOT_USD_HR}/h), preemptions {len(killed)} "
        f"({', '.join(killed)}), batch pods over time: 0 -> {max(pods_seen)} -> {pods_seen[-1]}"
    )
    assert job.state == "done", job.error
    assert all(not d for d in dupes.values()), dupes  # exactly once...
    assert {n: sorted(v) for n, v in frames.items()} == expected  # ...and none missing
    assert job.frames_done == job.frames_total == sum(len(v) for v in expected.values())
    assert job.cost_usd > 0 and job.duration_s is not None and job.duration_s > 0
    assert job.pod_seconds > 0 and job.finished_at is not None
    assert pods_seen[0] == 0 and max(pods_seen) >= 1 and pods_seen[-1] == 0


async def _ended(fleet: Any) -> JobView | None:
    view = await status(fleet, "night")
    return None if view.state in ("queued", "running") else view


async def _no_batch_pods(fleet: Any) -> bool:
    pods = await fleet.orch.store.pods()
    return not any(p.tier == "batch" for p in pods.values())
