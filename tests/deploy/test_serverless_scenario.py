"""Issue 29 acceptance, part 6: a serverless tier's endpoint, managed by a real
orchestrator process (``framerelay orchestrator``), scales from 0 workers to running
jobs and back to 0, and the job completes.

RunPod is played by two contract servers: the API v2 server (``/v2/serverless``, every
request and answer checked against RunPod's schema) and the serverless job API server
that the endpoint's ``requestUrls`` point to, running *our* handler with the real ONNX
model on CPU. When the orchestrator creates or updates the endpoint, the job server
takes the endpoint's id and idle timeout, as RunPod deploys it. The ingest is real (its
HTTP API, Redis, the task sidecars) and runs in this process.

1. The orchestrator starts with a serverless tier (``serverless: {idle_timeout_s: 2}``):
   it creates ``fr-night`` (queue-based, workers from 0) and no pod; the endpoint has
   no worker.
2. A batch job over two clips goes to the tier; the ingest sends the frames to the
   endpoint's own URLs; workers start (cold) and run the jobs; the job is ``done`` with
   each frame in its sidecar once; the workers stop after the idle timeout: 0 again.
3. The orchestrator restarts with another idle timeout: one PATCH, no second endpoint.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
import uvicorn
from redis import Redis

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from bench.rig.runpod_v2_contract import Call, ContractServer, Reply, running_runpod_v2
from framerelay.auth import KeySet
from framerelay.schemas import SidecarLine
from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.serverless import build_handler
from gpu_worker.settings import WorkerSettings
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import CLIP, MODEL, REDIS_URL, TIMEOUT_FACTOR, service_env
from tests.support.auth import ed_keys, mint
from tests.support.media import ffmpeg
from tests.support.runpod import start_orchestrator
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
KEY = "rpa_" + "S3rv3rl3ssSc3n" * 3
PRICE_PER_S = 0.00019
TIER = {
    "name": "night",
    "batch_only": True,
    "max_workers": 2,
    "gpu_types": ["NVIDIA L4"],
    "serverless": {"idle_timeout_s": 2},
    "serverless_price_per_s": PRICE_PER_S,
}


class Deploying(ContractServer):
    """RunPod's API v2 that deploys what it is told onto the job server: the endpoint's
    id (its request URLs lead there) and its idle timeout."""

    def __init__(self, key: str, queue: EndpointState) -> None:
        super().__init__(key)
        self.queue = queue

    def _create_endpoint(self, call: Call) -> Reply:
        return self._deploy(super()._create_endpoint(call))

    def _patch_endpoint(self, call: Call) -> Reply:
        return self._deploy(super()._patch_endpoint(call))

    def _deploy(self, reply: Reply) -> Reply:
        self.queue.endpoint_id = reply.body["id"]
        self.queue.idle_timeout_s = float(reply.body["workers"]["idleTimeout"])
        return reply


def clips(tmp: Path) -> list[Path]:
    """2 clips of 3 s at 10 fps (30 frames each), from two parts of the sample."""
    out = []
    for k, start in enumerate(("0", "4")):
        path = tmp / f"night-{k}.mp4"
        ffmpeg(
            "-ss",
            start,
            "-i",
            str(CLIP),
            "-t",
            "3",
            "-vf",
            "scale=320:240,fps=10",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "10",
            "-bf",
            "0",
            "-pix_fmt",
            "yuv420p",
            str(path),
        )
        out.append(path)
    return out


def decoded_pts(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        return [f.pts for f in container.decode(video=0) if f.pts is not None]


def sidecar_pts(path: Path) -> list[int]:
    lines = [SidecarLine.model_validate_json(raw) for raw in path.read_text().splitlines() if raw]
    return [line.pts for line in lines if line.pts is not None]


def workers(queue: EndpointState) -> int:
    """The endpoint's workers now (idle or running), as RunPod's /health counts them."""
    now = queue.health()["workers"]
    return int(now["idle"] + now["running"])


@contextlib.asynccontextmanager
async def running_ingest(
    keys: KeySet, prefix: str, queue_url: str, tmp: Path
) -> AsyncIterator[str]:
    """A real ingest (its HTTP API on 127.0.0.1) whose RunPod endpoint API is the job
    server; yields its URL."""
    settings = IngestSettings(
        signing_keys=keys.to_json(),
        worker_url="ws://127.0.0.1:9/none",
        redis_url=REDIS_URL,
        results=ResultsSettings(redis_prefix=prefix),
        store_key=f"{prefix}:streams",
        job_sidecar_dirs=(tmp,),
        serverless={
            "base_url": queue_url,
            "api_key": KEY,
            "poll_initial_s": 0.05,
            "poll_max_s": 0.2,
            "backoff_s": 0.05,
        },
    )
    ingest = IngestService(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    config = uvicorn.Config(create_app(ingest), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    await wait_until_async(lambda: server.started, 30, "the ingest's API")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
        stop.set()
        await asyncio.wait_for(task, 30)


class Orchestrator:
    """``framerelay orchestrator`` as a process; ``url`` once it serves."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.proc, self.url = start_orchestrator(env, log)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30 * TIMEOUT_FACTOR)


def orchestrator_env(
    tmp: Path, keys: KeySet, base: str, ingest: str, prefix: str
) -> dict[str, str]:
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(keys.to_json())
    return service_env(
        FRAMERELAY_SIGNING_KEYS_FILE=str(keys_file),
        FRAMERELAY_ORCH_CA_DIR=str(tmp / "ca"),
        FRAMERELAY_ORCH_PROVIDER="runpod",
        FRAMERELAY_ORCH_RUNPOD__API_KEY=KEY,
        FRAMERELAY_ORCH_RUNPOD__BASE_URL=base,
        FRAMERELAY_ORCH_RUNPOD__BACKOFF_S="0.05",
        FRAMERELAY_ORCH_KEY_PREFIX=f"{prefix}:orch:",
        FRAMERELAY_ORCH_TICK_S="0.3",
        FRAMERELAY_ORCH_LEASE_TTL_S="1",
        FRAMERELAY_ORCH_INGEST_URL=ingest,
        FRAMERELAY_ORCH_JOBS__REDIS_PREFIX=prefix,
        FRAMERELAY_ORCH_TIERS=json.dumps([TIER]),
    )


def clear(prefix: str) -> None:
    redis = Redis.from_url(REDIS_URL)
    for key in redis.scan_iter(match=f"{prefix}*"):
        redis.delete(key)
    redis.close()


@dataclass
class Rig:
    """What the scenario runs against."""

    tmp: Path
    keys: KeySet
    prefix: str
    queue: EndpointState
    server: Deploying
    log: Path


async def test_a_serverless_tier_scales_its_endpoint_from_zero_and_back_and_the_job_completes(
    tmp_path: Path,
) -> None:
    inputs = clips(tmp_path)
    expected = {p.name: sorted(decoded_pts(p)) for p in inputs}
    detector = OnnxDetectorSettings(model=MODEL, threads=1)
    handler = build_handler(WorkerSettings(detector=detector, worker_id="fr-night", max_batch=4))
    queue = EndpointState(KEY, handler, endpoint_id="not-deployed", workers=2, cold_start_s=0.3)
    server = Deploying(KEY, queue)
    rig = Rig(
        tmp_path,
        ed_keys(),
        f"test-sls-scn-{secrets.token_hex(4)}",
        queue,
        server,
        tmp_path / "orchestrator.log",
    )
    try:
        with running_endpoint(queue) as queue_url, running_runpod_v2(server) as base:
            server.knobs.serverless_url = queue_url
            figures = await scenario(rig, base, queue_url, inputs)
    finally:
        clear(rig.prefix)
    job = figures["job"]
    print(
        f"\nendpoint made {figures['made_s']:.1f} s after the orchestrator started; job "
        f"{job['state']} in {figures['took_s']:.1f} s ({job['frames_done']} frames, "
        f"{job['execution_s']:.2f} s billed, ${job['cost_usd']:.6f}); workers 0 -> "
        f"{figures['most']} -> 0 ({figures['idle_s']:.1f} s after the job); cold starts "
        f"{queue.cold_starts}; endpoint jobs {queue.health()['jobs']}; restart with a new "
        f"idle timeout: PATCH in {figures['patched_s']:.1f} s"
    )
    assert job["state"] == "done" and job["serverless_tier"] == "night", job
    sidecars = zip(job["inputs"], job["sidecars"], strict=True)
    frames = {Path(i).name: sidecar_pts(Path(s)) for i, s in sidecars}
    dupes = {n: [p for p, c in collections.Counter(v).items() if c > 1] for n, v in frames.items()}
    assert all(not d for d in dupes.values()), dupes  # each frame once...
    assert {n: sorted(v) for n, v in frames.items()} == expected  # ...and none missing
    assert job["frames_done"] == job["frames_total"] == sum(len(v) for v in expected.values())
    assert job["cost_usd"] == pytest.approx(job["execution_s"] * PRICE_PER_S, rel=1e-3, abs=6e-7)
    assert figures["before"] == 0 and figures["most"] >= 1 and figures["after"] == 0
    assert queue.cold_starts >= 1 and queue.health()["jobs"]["completed"] >= 2
    (endpoint,) = server.endpoints.values()  # one endpoint, through both runs
    assert endpoint["name"] == "fr-night"
    assert endpoint["workers"] == {"min": 0, "max": 2, "idleTimeout": 3}
    assert [e.status for e in server.requests("POST", "/v2/serverless")] == [201]
    assert [e.status for e in server.requests("PATCH", "/v2/serverless/{id}")] == [200]
    # the ingest used the endpoint's request URLs, which lead to the deployed endpoint
    assert all(path.startswith(f"/v2/{endpoint['id']}/") for _, path in queue.requests)
    assert server.pods == {}  # a serverless tier rents no pod
    assert server.violations == [] and server.client_errors == []
    assert not server.key_in_url and not queue.key_in_url
    assert KEY not in rig.log.read_text()


async def scenario(rig: Rig, base: str, queue_url: str, inputs: list[Path]) -> dict[str, Any]:
    """The first run (the endpoint made, the job), then a restart with a new idle timeout."""
    async with running_ingest(rig.keys, rig.prefix, queue_url, rig.tmp) as ingest:
        env = orchestrator_env(rig.tmp, rig.keys, base, ingest, rig.prefix)
        figures = await first_run(rig, env, inputs)
        changed = [{**TIER, "serverless": {"idle_timeout_s": 3}}]
        env["FRAMERELAY_ORCH_TIERS"] = json.dumps(changed)
        started = time.monotonic()
        orch = await asyncio.to_thread(Orchestrator, env, rig.log)
        try:
            await wait_until_async(
                lambda: rig.queue.idle_timeout_s == 3.0, 30, "the endpoint patched"
            )
            figures["patched_s"] = time.monotonic() - started
            await asyncio.sleep(1.0)  # a few more passes: nothing else is sent
        finally:
            await asyncio.to_thread(orch.stop)
    return figures


async def first_run(rig: Rig, env: dict[str, str], inputs: list[Path]) -> dict[str, Any]:
    """The orchestrator makes the endpoint; a job runs on it; its workers come and go."""
    started = time.monotonic()
    orch = await asyncio.to_thread(Orchestrator, env, rig.log)
    token = mint(rig.keys, ["jobs:read", "jobs:write"], "orchestrator", ttl=600)
    headers = {"Authorization": f"Bearer {token}"}
    figures: dict[str, Any] = {}
    try:
        await wait_until_async(
            lambda: rig.queue.endpoint_id != "not-deployed", 30, "the endpoint made"
        )
        figures["made_s"] = time.monotonic() - started
        figures["before"] = workers(rig.queue)
        async with httpx.AsyncClient(base_url=orch.url, headers=headers, timeout=10) as api:
            body = {"id": "night1", "inputs": [str(p) for p in inputs], "max_parallel": 2}
            resp = await api.post("/v1/jobs", json=body)
            assert resp.status_code == 201, resp.text
            job, most, took = await watch(api, rig.queue)
        figures.update(job=job, most=most, took_s=took)
        waited = time.monotonic()
        await wait_until_async(lambda: workers(rig.queue) == 0, 30, "the workers gone")
        figures["idle_s"] = time.monotonic() - waited
        figures["after"] = workers(rig.queue)
    finally:
        await asyncio.to_thread(orch.stop)
    return figures


async def watch(api: httpx.AsyncClient, queue: EndpointState) -> tuple[dict[str, Any], int, float]:
    """Until the job ends: its view, the most workers the endpoint had, seconds taken."""
    start, most = time.monotonic(), [0]

    async def ended() -> dict[str, Any] | None:
        most[0] = max(most[0], workers(queue))
        resp = await api.get("/v1/jobs/night1")
        job: dict[str, Any] = resp.json()
        return None if job["state"] in ("queued", "running") else job

    job = await wait_until_async(ended, 120, "the job to end", every_s=0.1)
    return job, most[0], time.monotonic() - start
