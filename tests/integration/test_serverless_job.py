"""A job task on a serverless tier, end to end on 127.0.0.1 (issue 18, serverless mode).

First test: the ingest service as deployed (its REST API, its registry, its job tasks
with the real Redis for checkpoint and progress and the real sidecar) gets a task whose
``job.serverless_endpoint_id`` names an endpoint, as the orchestrator sends a task on a
serverless tier: the registry's hook serves it with :mod:`ingest.serverless_task`
instead of a tunnel, against the RunPod serverless contract server running *our*
handler with the real ONNX model on CPU in two worker threads. Faults: one request
answered 500 (retried by the link), one ``/run`` whose answer is lost (the job runs
twice), one job failing on its worker (submitted again). Second test: the task stream
and sender alone, with a batch lost for good (the task reads again from its
checkpoint). Every frame of the clip is in the sidecar exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
from pydantic import SecretStr
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from framerelay.jobs import JobTask, TaskProgress, checkpoint_key, progress_key, task_stream_id
from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.serverless import ServerlessHandler, build_handler
from gpu_worker.settings import WorkerSettings
from ingest.app import create_app
from ingest.job_task import JobRuns
from ingest.serverless_link import ServerlessSettings
from ingest.serverless_task import Batching, serve_stream
from ingest.service import IngestService
from ingest.settings import IngestSettings, StreamConfig
from ingest.stream import IngestStream, StreamState
from tests.conftest import MODEL, REDIS_URL
from tests.support.auth import mint
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.media import Media
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
KEY = "rp_job_" + "j" * 24
ENDPOINT = "ep-jobs"


@pytest.fixture(scope="module")
def handler() -> ServerlessHandler:
    settings = WorkerSettings(detector=OnnxDetectorSettings(model=MODEL, threads=1),
                              worker_id="sls-1", max_batch=4)  # fmt: skip
    return build_handler(settings)


@pytest.fixture
def endpoint(handler: ServerlessHandler) -> Iterator[tuple[EndpointState, str]]:
    state = EndpointState(KEY, handler, endpoint_id=ENDPOINT, workers=2)
    with running_endpoint(state) as url:
        yield state, url


@pytest.fixture
def clip(media: Media, tmp_path: Path) -> tuple[Path, list[int]]:  # noqa: F811 - fixture
    """4 s of the H.264 sample clip (100 frames) and its frames' PTS."""
    out = tmp_path / "seg-000.mp4"
    from tests.support.media import ffmpeg

    ffmpeg("-i", str(media.short("mp4")), "-t", "4", "-c", "copy", str(out))
    with av.open(str(out)) as container:
        pts = [f.pts for f in container.decode(video=0) if f.pts is not None]
    return out, pts


async def _run_task(url: str, clip: Path, sidecar: Path, prefix: str, batching: Batching) -> None:
    task = JobTask(job_id="night-1", index=0, sidecar=str(sidecar))
    config = StreamConfig(id=task_stream_id("night-1", 0), url=str(clip), realtime=False,
                          fps=0, job=task)  # fmt: skip
    settings = ServerlessSettings(base_url=url, api_key=SecretStr(KEY), poll_initial_s=0.05,
                                  poll_max_s=0.2, backoff_s=0.05)  # fmt: skip

    stream = IngestStream(config, asyncio.get_running_loop(), max_inflight=4)
    runs = JobRuns(REDIS_URL, prefix, sidecar_dirs=(sidecar.parent,))
    runs.attach(stream)
    sender = asyncio.create_task(
        serve_stream(stream, settings, ENDPOINT, runs.result_seen, batching)
    )

    def ended() -> bool:
        assert not sender.done() or sender.exception() is None
        return not (stream.alive or stream.state is StreamState.STARTING)

    try:
        await wait_until_async(ended, 120, "the task to end", every_s=0.1)
    finally:
        stream.stop()
        await asyncio.wait_for(sender, 30)
        await runs.aclose()
        stream.join(10)


def _lines(sidecar: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in sidecar.read_text().splitlines() if x]


def _check_exactly_once(sidecar: Path, pts: list[int], prefix: str) -> TaskProgress:
    lines = _lines(sidecar)
    ids = [x["id"] for x in lines]
    assert len(ids) == len(set(ids)), "a frame written twice"
    assert sorted(x["pts"] for x in lines) == sorted(pts), "frames missing or extra"
    assert all(x["segment"] == "seg-000.mp4" and x["exact"] for x in lines)
    person_frames = sum(any(d["class_name"] == "person" for d in x["result"]["detections"])
                        for x in lines)  # fmt: skip
    assert person_frames >= len(lines) * 0.9  # TUD-Stadtmitte: people in every frame
    assert all(x["result"]["worker_id"].startswith(f"serverless:{ENDPOINT}/") for x in lines)
    assert all(x["result"]["timings"].keys() >= {"batch_infer_ms"} for x in lines)
    r = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        raw_progress = r.get(progress_key(prefix, "night-1", 0))
        raw_checkpoint = r.get(checkpoint_key(prefix, "night-1", 0))
        assert isinstance(raw_progress, str) and isinstance(raw_checkpoint, str)
        progress = TaskProgress.model_validate_json(raw_progress)
        checkpoint = int(raw_checkpoint)
        r.delete(progress_key(prefix, "night-1", 0), checkpoint_key(prefix, "night-1", 0))
    finally:
        r.close()
    assert progress.state == "done" and progress.frames_done == len(pts)
    assert checkpoint > max(pts)
    return progress


async def _serve_through_the_ingest(url: str, clip: Path, sidecar: Path, prefix: str) -> float:
    """POST the task to a real ingest service; seconds until its progress says done."""
    secret = secrets.token_urlsafe(32)
    settings = IngestSettings(
        worker_url=f"ws://127.0.0.1:{free_port()}/v1/tunnel", token_secrets=secret,
        store_path=sidecar.parent / "streams.json", redis_url=REDIS_URL,
        results={"redis_prefix": prefix}, job_sidecar_dirs=(sidecar.parent,),
        serverless={"base_url": url, "api_key": KEY, "poll_initial_s": 0.05,
                    "poll_max_s": 0.2, "backoff_s": 0.05},
    )  # fmt: skip
    body = {"id": task_stream_id("night-1", 0), "url": str(clip), "fps": 0, "realtime": False,
            "job": {"job_id": "night-1", "index": 0, "sidecar": str(sidecar),
                    "serverless_endpoint_id": ENDPOINT}}  # fmt: skip

    service = IngestService(settings)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    token = mint(secret, ["streams:read", "streams:write"], "ingest", ttl=600)
    transport = httpx.ASGITransport(app=create_app(service))

    async def ended() -> bool:
        return await _state(prefix) in ("done", "failed")

    try:
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://ingest",
            headers={"Authorization": f"Bearer {token}"},
        ) as http:
            await wait_until_async(service.started.is_set, 10, "ingest start")
            t0 = time.monotonic()
            created = await http.post("/v1/streams", json=body)
            assert created.status_code == 201, created.text
            await wait_until_async(ended, 120, "the task to end")
            return time.monotonic() - t0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def _state(prefix: str) -> str | None:
    r = AsyncRedis.from_url(REDIS_URL, decode_responses=True)
    try:
        raw = await r.get(progress_key(prefix, "night-1", 0))
    finally:
        await r.aclose()
    return TaskProgress.model_validate_json(raw).state if isinstance(raw, str) else None


async def test_job_task_on_a_serverless_endpoint_every_frame_once(
    endpoint: tuple[EndpointState, str],
    clip: tuple[Path, list[int]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, url = endpoint
    path, pts = clip
    state.faults.fail_next = 1  # a request answered 500: the link retries it
    state.faults.lose_run_answer_next = 1  # a /run answer lost: the job is queued twice
    state.faults.crash_next_jobs = 2  # the orphan of the lost answer, then a job of ours
    prefix = f"test-sls-{secrets.token_hex(4)}"
    sidecar = tmp_path / "out" / "seg-000.jsonl"
    caplog.set_level(logging.INFO, logger="ingest")
    took = await _serve_through_the_ingest(url, path, sidecar, prefix)
    _check_exactly_once(sidecar, pts, prefix)
    health = state.health()["jobs"]
    print(f"{len(pts)} frames in {took:.1f} s; jobs {health}; handler calls "
          f"{state.handler_calls}; requests {len(state.requests)}")  # fmt: skip
    assert health["failed"] == 2 and state.faults.fail_next == 0
    assert state.faults.lose_run_answer_next == 0
    assert "submitting again" in caplog.text and "retrying" in caplog.text
    assert "worker time" in caplog.text
    assert not state.key_in_url and KEY not in caplog.text


async def test_a_batch_lost_for_good_is_read_again(
    endpoint: tuple[EndpointState, str], clip: tuple[Path, list[int]], tmp_path: Path
) -> None:
    state, url = endpoint
    path, pts = clip
    state.faults.crash_next_jobs = 2  # attempts=2: the first batch is lost, then re-read
    prefix = f"test-sls-{secrets.token_hex(4)}"
    sidecar = tmp_path / "seg-000.jsonl"
    await _run_task(url, path, sidecar, prefix, Batching(max_frames=25, max_jobs=1, attempts=2))
    _check_exactly_once(sidecar, pts, prefix)
    assert state.health()["jobs"]["failed"] == 2
