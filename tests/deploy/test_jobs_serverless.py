"""A job on a serverless tier, the whole fleet on 127.0.0.1 (issue 18, serverless mode).

Everything real but RunPod: the orchestrator (in process: scaler, placement, job driver,
its HTTP link to the ingest), a real ingest behind its HTTP API, real Redis, and the
RunPod serverless contract server running *our* handler with the real ONNX model on CPU.
The tiers: an on-demand and a batch-only spot tier of pods (local provider, both from
zero) and a serverless tier. A batch job over 2 short clips goes to the serverless tier
(``serverless`` unset: the cheapest a batch job may use); the orchestrator gives each
task's definition to the ingest (``POST /v1/streams``, no worker) and the ingest serves it
from the endpoint. One job crashes on its worker (the contract server's fault): it is
submitted again. Checked: the job is done, every frame of each clip is in its sidecar
exactly once, no pod is ever created (store and provider), the ingest never opens a
tunnel and forgets the task streams at the end (``DELETE /v1/streams/{id}``), and the
cost is the execution time RunPod reports times the tier's price a second.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from pathlib import Path
from typing import Any

import av
import pytest
from fastapi import FastAPI, Request, Response
from redis.asyncio import Redis

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from deploy.cost import CostTotals
from deploy.ingest_link import HttpIngestLink
from deploy.jobs import (
    JobRecord,
    JobView,
    TaskRecord,
    advance,
    job_rates,
    job_view,
    placement_view,
    task_spec,
)
from deploy.jobs_api import new_job
from deploy.models import PodRecord, StreamSpec
from deploy.scaling import tier_targets
from deploy.serverless_jobs import NoServerlessTier, ServerlessChoice, choose
from deploy.settings import LocalSettings, OrchestratorSettings, TierConfig
from framerelay.auth import AUD_INGEST, TokenIssuer, TokenVerifier
from framerelay.commands.jobs import describe
from framerelay.jobs import JobSpec, JobTask, TaskProgress, progress_key
from framerelay.schemas import SidecarLine
from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.serverless import ServerlessHandler, build_handler
from gpu_worker.settings import WorkerSettings
from ingest.job_ledger import Figures
from ingest.job_task import JobRun
from ingest.settings import ResultsSettings, StreamConfig
from ingest.stream import IngestStream
from tests.conftest import CLIP, MODEL, REDIS_URL
from tests.support.auth import ed_keys
from tests.support.fleet import clear_prefix, running_fleet, settings_for
from tests.support.media import ffmpeg
from tests.support.orchestrator import serving
from tests.support.waiting import wait_until_async

KEY = "rp_fleet_" + "k" * 24
ENDPOINT = "ep-night"
PRICE_PER_S = 0.00019  # RunPod's flex price a second for a 16 GB GPU (2026)
JOB_LIMIT_S = 90.0
TIERS = [
    TierConfig(name="ondemand", min_warm=0, max_workers=1, capacity_fps=12),
    TierConfig(name="batch", interruptible=True, batch_only=True, min_warm=0, max_workers=2),
    TierConfig(name="night", batch_only=True, serverless_endpoint_id=ENDPOINT,
               serverless_price_per_s=PRICE_PER_S),
]  # fmt: skip


@pytest.fixture(scope="module")
def handler() -> ServerlessHandler:
    settings = WorkerSettings(detector=OnnxDetectorSettings(model=MODEL, threads=1),
                              worker_id="sls-1", max_batch=4)  # fmt: skip
    return build_handler(settings)


def clips(tmp: Path) -> list[Path]:
    """2 clips of 4 s at 10 fps (40 frames each), from two parts of the sample."""
    out = []
    for k, start in enumerate(("0", "3")):  # the sample is 7.2 s long
        path = tmp / f"clip-{k}.mp4"
        ffmpeg("-ss", start, "-i", str(CLIP), "-t", "4", "-vf", "scale=320:240,fps=10",
               "-c:v", "libx264", "-preset", "ultrafast", "-g", "10", "-bf", "0",
               "-pix_fmt", "yuv420p", str(path))  # fmt: skip
        out.append(path)
    return out


def decoded_pts(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        return [f.pts for f in container.decode(video=0) if f.pts is not None]


def sidecar_pts(path: Path) -> list[int]:
    lines = [SidecarLine.model_validate_json(raw) for raw in path.read_text().splitlines() if raw]
    assert all(line.result.worker_id.startswith(f"serverless:{ENDPOINT}/") for line in lines)
    return [line.pts for line in lines if line.pts is not None]


async def status(fleet: Any, job_id: str) -> JobView:
    rec = await fleet.orch.jobs.get(job_id)
    assert rec is not None
    return job_view(rec, await fleet.orch.jobs.progress(rec), time.time())


def billed_s(state: EndpointState) -> float:
    """What the endpoint billed: every ended job's executionTime."""
    ms = sum(int(j.view().get("executionTime", 0)) for j in list(state.jobs.values()))
    return ms / 1000


@pytest.mark.integration
async def test_a_job_on_a_serverless_tier_rents_no_pod_and_writes_each_frame_once(
    secret: str, tmp_path: Path, handler: ServerlessHandler
) -> None:
    inputs = clips(tmp_path)
    expected = {p.name: sorted(decoded_pts(p)) for p in inputs}
    prefix = f"test-job-sls-{secrets.token_hex(4)}"
    settings = settings_for(secret, tmp_path / "ca", tiers=TIERS, jobs={"redis_prefix": prefix},
                            local=LocalSettings(model=MODEL, threads=1))  # fmt: skip
    state = EndpointState(KEY, handler, endpoint_id=ENDPOINT, workers=2)
    state.faults.crash_next_jobs = 1  # a worker dies under one job: submitted again
    pods_seen: list[int] = []
    tunnels: set[str] = set()

    async def watch(fleet: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            pods = len(await fleet.orch.store.pods()) + len(await fleet.provider.list())
            pods_seen.append(pods)
            tunnels.update(fleet.pool.placed())
            await asyncio.sleep(0.2)

    cost: dict[str, float] = {}
    try:
        with running_endpoint(state) as url:
            serverless = {
                "base_url": url,
                "api_key": KEY,
                "poll_initial_s": 0.05,
                "poll_max_s": 0.2,
                "backoff_s": 0.05,
            }
            over = {
                "redis_url": REDIS_URL,
                "results": ResultsSettings(redis_prefix=prefix),
                "serverless": serverless,
                "store_key": f"{prefix}:streams",
                "job_sidecar_dirs": (tmp_path,),
            }
            async with running_fleet(settings, ingest_over=over) as fleet:
                stop = asyncio.Event()
                watcher = asyncio.create_task(watch(fleet, stop))
                spec = JobSpec(id="night", inputs=[str(p) for p in inputs], max_parallel=2)
                t0 = time.monotonic()
                assert await fleet.orch.jobs.submit(await new_job(fleet.orch, spec))
                ended = await wait_until_async(
                    lambda: _ended(fleet), JOB_LIMIT_S, "job finished", every_s=0.1
                )
                took = time.monotonic() - t0
                await wait_until_async(
                    lambda: _no_tasks(fleet), 10, "task streams gone from the ingest", every_s=0.1
                )
                await asyncio.sleep(1.0)  # a few more passes: still no pod
                stop.set()
                await watcher
                cost.update(await fleet.orch.store.cost())
                job, left = ended, set(fleet.pool.streams)
                counters = dict(fleet.orch.fleet.counters)
    finally:
        await clear_prefix(prefix)
    frames = {Path(i).name: sidecar_pts(Path(s)) for i, s in zip(job.inputs, job.sidecars,
                                                                  strict=True)}  # fmt: skip
    dupes = {n: [p for p, c in collections.Counter(v).items() if c > 1] for n, v in frames.items()}
    billed, jobs = billed_s(state), state.health()["jobs"]
    print(
        f"\njob {job.id}: {job.state} on tier {job.serverless_tier} in {job.duration_s} s "
        f"(submit to end {took:.1f} s), frames {job.frames_done}/{job.frames_total}, "
        f"execution {job.execution_s:.2f} s (endpoint billed {billed:.2f} s), cost "
        f"${job.cost_usd:.6f} at ${PRICE_PER_S}/s, pod-s {job.pod_seconds}, endpoint jobs "
        f"{jobs}, cold starts {state.cold_starts}, pods seen max {max(pods_seen)}"
    )
    assert job.state == "done", job.error
    assert job.serverless_tier == "night"
    assert all(not d for d in dupes.values()), dupes  # exactly once...
    assert {n: sorted(v) for n, v in frames.items()} == expected  # ...and none missing
    assert job.frames_done == job.frames_total == sum(len(v) for v in expected.values())
    assert max(pods_seen) == 0 and counters.get("created", 0) == 0, counters  # no pod
    assert not tunnels, tunnels  # never on a tunnel
    assert not {s for s in left if s.startswith("job-night-")}, left  # withdrawn at the end
    assert jobs["failed"] == 1 and state.faults.crash_next_jobs == 0
    assert job.execution_s == pytest.approx(billed, abs=0.002 * (jobs["completed"] + 1))
    assert job.execution_s > 0 and job.pod_seconds == 0
    # the API shows cost rounded to a millionth of a dollar (5e-7 of rounding either way)
    assert job.cost_usd == pytest.approx(job.execution_s * PRICE_PER_S, rel=1e-3, abs=6e-7)
    totals = CostTotals.from_flat(cost)  # the fleet's cost counts the endpoint's seconds
    assert totals.serverless_usd == pytest.approx(job.cost_usd, rel=1e-3, abs=6e-7)
    assert totals.fleet_usd == pytest.approx(totals.serverless_usd)  # and no pod
    assert totals.by_tier_usd == pytest.approx({"night": totals.serverless_usd})


async def _ended(fleet: Any) -> JobView | None:
    view = await status(fleet, "night")
    return None if view.state in ("queued", "running") else view


async def _no_tasks(fleet: Any) -> bool:
    return not any(s.startswith("job-night-") for s in fleet.pool.streams)


# -- the pieces --------------------------------------------------------------------------


def fleet_settings(*extra: TierConfig) -> OrchestratorSettings:
    return OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=[*TIERS, *extra],
                                default_capacity_fps=20)  # fmt: skip


def spec(**over: Any) -> JobSpec:
    return JobSpec(inputs=["/r/a.mp4"], **over)


def test_a_job_runs_on_the_cheapest_serverless_tier_its_priority_allows() -> None:
    dear = TierConfig(name="day", serverless_endpoint_id="ep-day", serverless_price_per_s=0.001)
    cheap = TierConfig(name="flex", serverless_endpoint_id="ep-flex",
                       serverless_price_per_s=0.0001)  # fmt: skip
    s = fleet_settings(dear, cheap)
    assert choose(s, spec()) == ServerlessChoice(tier="flex", endpoint_id="ep-flex",
                                                 price_per_s=0.0001)  # fmt: skip
    assert choose(s, spec(serverless=False)) is None  # pods
    only_batch = fleet_settings()  # "night" is batch_only: a standard job may not use it
    assert choose(only_batch, spec()) is not None
    assert choose(only_batch, spec(priority="standard")) is None
    with pytest.raises(NoServerlessTier, match="no serverless tier takes a standard job"):
        choose(only_batch, spec(priority="standard", serverless=True))
    none = OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=TIERS[:2])
    assert choose(none, spec()) is None  # no serverless tier: on pods, as before
    old = JobRecord.model_validate_json(
        '{"id": "j0", "spec": {"inputs": ["/r/a.mp4"]}, "submitted_at": 1,'
        ' "tasks": [{"input": "/r/a.mp4", "sidecar": "/r/a.jsonl"}]}'
    )  # a job stored before serverless mode
    assert old.serverless is None and old.spec.serverless is None


def serverless_job(n: int = 2) -> JobRecord:
    tasks = [TaskRecord(input=f"/r/s{k}.mp4", sidecar=f"/r/s{k}.jsonl") for k in range(n)]
    return JobRecord(id="j1", spec=JobSpec(inputs=[t.input for t in tasks]), tasks=tasks,
                     submitted_at=1.0, serverless=choose(fleet_settings(), spec()))  # fmt: skip


def test_a_serverless_task_names_its_endpoint_and_no_pod_is_planned_or_placed_for_it() -> None:
    s, rec = fleet_settings(), serverless_job()
    task = task_spec(rec, 0)
    assert task.job is not None and task.job.serverless_endpoint_id == ENDPOINT
    live = StreamSpec(id="cam", url="rtsp://x", fps=5, priority="batch")
    assert placement_view(s, [task], {}, {}) == []  # not weighed: served from its endpoint
    assert tier_targets(s, [task], {}, {}, 0.0) == {"ondemand": 0, "batch": 0, "night": 0}
    warm = TierConfig(name="night", batch_only=True, serverless_endpoint_id=ENDPOINT,
                      min_warm=3, max_workers=4)  # fmt: skip
    s2 = OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=[TIERS[0], warm])
    # the serverless tier rents no pod, even warm; a batch live stream is not pinned to it
    assert tier_targets(s2, [live], {}, {}, 0.0) == {"ondemand": 1, "night": 0}


def test_a_serverless_job_costs_its_execution_time_and_no_pod_share() -> None:
    rec = serverless_job()
    advance(rec, [None, None], [], 10.0, (0.0, 0.0), 60)
    billed = [TaskProgress(state="running", execution_s=2.0),
              TaskProgress(state="running", execution_s=1.5)]  # fmt: skip
    advance(rec, billed, ["job-j1-0", "job-j1-1"], 12.0, (0.0, 0.0), 60)
    assert rec.cost_usd == pytest.approx(3.5 * PRICE_PER_S)
    later = [TaskProgress(state="done", execution_s=2.5), None]  # task 1 not readable now
    advance(rec, later, ["job-j1-0", "job-j1-1"], 13.0, (0.0, 0.0), 60)
    assert [t.execution_s for t in rec.tasks] == [2.5, 1.5]  # never less than known
    assert rec.cost_usd == pytest.approx(4.0 * PRICE_PER_S)
    view = job_view(rec, later, 13.0)
    assert (view.execution_s, view.serverless_tier, view.pod_seconds) == (4.0, "night", 0.0)
    assert "serverless tier: night (4.0 s of execution billed)" in describe(view.model_dump())
    idle = PodRecord(name="fr-batch-0-g0", tier="batch", slot=0, gen=0, spot=True,
                     provider_id="p1", cost_per_hr=3.6)  # fmt: skip
    rates = job_rates([rec], {idle.name: idle}, {}, fleet_settings())
    assert rates["j1"] == (0.0, 0.0)  # idle batch pods are not its to pay


@pytest.mark.integration
async def test_the_ingest_carries_a_tasks_billed_time_over_from_its_last_run(
    tmp_path: Path,
) -> None:
    """A task's run on a restarted ingest adds its endpoint's time to what the last run
    reported, so the job is never charged less than was billed."""
    prefix = f"test-job-sls-{secrets.token_hex(4)}"
    task = JobTask(job_id="night", index=0, sidecar=str(tmp_path / "a.jsonl"))
    config = StreamConfig(id="job-night-0", url=str(tmp_path / "a.mp4"), realtime=False,
                          fps=0, job=task)  # fmt: skip
    key = progress_key(prefix, "night", 0)

    redis = Redis.from_url(REDIS_URL)
    try:
        await redis.set(key, TaskProgress(state="running", execution_s=4.25).model_dump_json())
        stream = IngestStream(config, asyncio.get_running_loop(), max_inflight=4)
        run = JobRun(stream, task, redis, prefix)
        await run._read_checkpoint()  # as its start does
        run.billed_s = 1.5  # what its endpoint billed this run (ingest.serverless_task)
        assert await run._write("running", Figures(None, 0, False))
        raw = await redis.get(key)
        assert raw is not None
        progress = TaskProgress.model_validate_json(raw)
    finally:
        await redis.delete(key)
        await redis.aclose()

    assert progress.execution_s == pytest.approx(5.75)


async def test_the_ingest_link_serves_with_a_streams_write_token_and_settles_409_and_404() -> None:
    """After an orchestrator restart the definition is posted again: 409 (it runs there)
    counts as done, as a 404 does for a withdrawal; the token has streams:write alone."""
    keys, calls = ed_keys(), list[tuple[str, int, frozenset[str]]]()
    verifier = TokenVerifier(keys.public(), AUD_INGEST)
    app, held = FastAPI(), set[str]()

    @app.post("/v1/streams")
    async def post(request: Request) -> Response:
        claims = verifier.verify(request.headers["authorization"][7:], "streams:write")
        sid = (await request.json())["id"]
        code = 409 if sid in held else 201
        held.add(sid)
        calls.append(("POST", code, frozenset(claims.scope)))
        return Response(status_code=code)

    @app.delete("/v1/streams/{sid}")
    async def delete(sid: str, request: Request) -> Response:
        claims = verifier.verify(request.headers["authorization"][7:], "streams:write")
        code = 204 if sid in held else 404
        held.discard(sid)
        calls.append(("DELETE", code, frozenset(claims.scope)))
        return Response(status_code=code)

    task = task_spec(serverless_job(1), 0)

    async def talk(url: str) -> list[bool]:
        link = HttpIngestLink(url, TokenIssuer(keys))
        try:
            return [await link.serve(task), await link.serve(task),
                    await link.unserve(task.id), await link.unserve(task.id)]  # fmt: skip
        finally:
            await link.aclose()

    with serving(app) as url:
        assert await talk(url) == [True, True, True, True]
    assert [(m, c) for m, c, _ in calls] == [("POST", 201), ("POST", 409), ("DELETE", 204),
                                             ("DELETE", 404)]  # fmt: skip
    assert all(scope == {"streams:write"} for _, _, scope in calls)
