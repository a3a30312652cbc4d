"""Job tasks on a real ingest (issue 18): real worker processes, real Redis (127.0.0.1:6379,
a prefix of its own per test), the sample clip re-encoded by ffmpeg.

Every frame of a task ends in its sidecar exactly once, judged against the frames PyAV
decodes from the file on its own (sampled by the documented rule): when the worker dies
mid-task and the orchestrator places the stream on another one, when the stream is moved
between two healthy workers, and when the ingest is killed (-9) and started again (it
resumes at the checkpoint: no frame below it is sent again). A corrupt file fails its
task clearly while the other task runs on. Progress figures are checked on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from framerelay.jobs import TaskProgress, checkpoint_key, progress_key, task_stream_id
from framerelay.launcher import LocalWorker
from framerelay.results import ResultRecord
from framerelay.schemas import SidecarLine
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from tests.conftest import REDIS_URL, ROOT, TIMEOUT_FACTOR, service_env
from tests.support.auth import mint
from tests.support.failover import workers
from tests.support.media import Media
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
FPS = 5.0


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis prefix of this test's own; its keys are deleted afterwards."""
    name = f"test-jobs-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def expected_pts(path: Path, fps: float) -> list[int]:
    """The task's frames, decoded by PyAV on its own: the first frame of each 1/fps
    period (every frame at 0)."""
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        assert stream.time_base is not None
        tb = Fraction(stream.time_base)
        pts = [f.pts for f in c.decode(stream) if f.pts is not None]
    f = Fraction(fps)
    return [p for i, p in enumerate(pts) if fps <= 0 or i == 0
            or math.floor(p * tb * f) > math.floor(pts[i - 1] * tb * f)]  # fmt: skip


def sidecar_pts(path: Path) -> list[int]:
    lines = [SidecarLine.model_validate_json(x) for x in path.read_text().splitlines()]
    assert all(x.id == x.result.id and x.pts == x.result.pts for x in lines)
    return [x.pts for x in lines if x.pts is not None]


async def progress(prefix: str, job: str, k: int = 0) -> TaskProgress | None:
    async with AsyncRedis.from_url(REDIS_URL) as client:
        raw = await client.get(progress_key(prefix, job, k))
    return TaskProgress.model_validate_json(raw) if raw is not None else None


async def checkpoint(prefix: str, job: str, k: int = 0) -> int | None:
    async with AsyncRedis.from_url(REDIS_URL) as client:
        raw = await client.get(checkpoint_key(prefix, job, k))
    return int(raw) if raw is not None else None


def task(job: str, url: Path, sidecar: Path, k: int = 0, fps: float = FPS) -> dict[str, Any]:
    """A task stream's definition as the orchestrator sends it."""
    return {"id": task_stream_id(job, k), "url": str(url), "fps": fps,
            "job": {"job_id": job, "index": k, "sidecar": str(sidecar)}}  # fmt: skip


@contextlib.asynccontextmanager
async def ingest(
    secret: str, tmp_path: Path, prefix: str
) -> AsyncIterator[tuple[IngestService, httpx.AsyncClient, list[ResultRecord]]]:
    """The ingest service (in process, Redis for its jobs) and its API."""
    settings = IngestSettings(
        worker_url=f"ws://127.0.0.1:{free_port()}/v1/tunnel", token_secrets=secret,
        store_path=tmp_path / "streams.json", redis_url=REDIS_URL,
        results={"redis_prefix": prefix}, job_sidecar_dirs=(tmp_path,),
    )  # fmt: skip
    service = IngestService(settings)
    got: list[ResultRecord] = []
    service.bus.tap(got.append)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    scopes = ["streams:read", "streams:write", "routing:write"]
    headers = {"Authorization": f"Bearer {mint(secret, scopes, 'ingest', ttl=600)}"}
    transport = httpx.ASGITransport(app=create_app(service))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://ingest",
                                     headers=headers) as http:  # fmt: skip
            await wait_until_async(service.started.is_set, 10, "ingest start")
            yield service, http, got
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def place(http: httpx.AsyncClient, worker: LocalWorker, body: dict[str, Any]) -> None:
    """``PUT /v1/streams/{id}/worker`` as the orchestrator does."""
    put = {"worker_id": worker.worker_id, "url": worker.url, "stream": body}
    r = await http.put(f"/v1/streams/{body['id']}/worker", json=put)
    assert r.status_code == 200, r.text


async def until_done(prefix: str, job: str, timeout_s: float, k: int = 0) -> list[TaskProgress]:
    """Every distinct progress seen until the task is done (or failed)."""
    seen: list[TaskProgress] = []

    async def ended() -> bool:
        now = await progress(prefix, job, k)
        if now is not None and (not seen or now != seen[-1]):
            seen.append(now)
        return now is not None and now.state in ("done", "failed")

    await wait_until_async(ended, timeout_s, f"task {job}/{k} to end")
    return seen


async def frames_done_at_least(prefix: str, job: str, n: int, timeout_s: float = 60) -> None:
    async def enough() -> bool:
        now = await progress(prefix, job)
        return now is not None and now.frames_done >= n

    await wait_until_async(enough, timeout_s, f"{n} frames of {job}")


async def test_a_task_runs_once_a_corrupt_one_fails_and_refusals(
    local_worker: LocalWorker, secret: str, media: Media, tmp_path: Path, prefix: str
) -> None:
    clip = media.short("mp4")
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(os.urandom(64 * 1024))
    good, bad = tmp_path / "out" / "good.jsonl", tmp_path / "out" / "bad.jsonl"

    async with ingest(secret, tmp_path, prefix) as (service, http, got):
        refused = await http.post("/v1/streams", json={**task("j1", clip, good), "realtime": True})
        assert refused.status_code == 422 and "realtime" in refused.text
        await place(http, local_worker, task("j2", garbage, bad))
        await place(http, local_worker, task("j1", clip, good))
        seen = await until_done(prefix, "j1", 90)
        failed = await until_done(prefix, "j2", 10)
        await wait_until_async(lambda: service.streams["job-j1-0"].finished, 10, "stream end")
        view = (await http.get("/v1/streams/job-j1-0")).json()
        results = [r for r in got if r.stream_id == "job-j1-0"]
    want = expected_pts(clip, FPS)
    assert sidecar_pts(good) == want  # every sampled frame once, in order
    assert sorted(r.pts for r in results) == want  # the bus had them too (its own ids)
    done = seen[-1]
    assert (done.state, done.frames_done, done.frames_total) == ("done", len(want), len(want))
    assert done.checkpoint_pts == want[-1] + 1 and done.time_base == (1, 12800)
    running = [p for p in seen if p.state == "running"]
    assert running and all(p.frames_total == len(want) for p in running if p.frames_total)
    assert [p.frames_done for p in seen] == sorted(p.frames_done for p in seen)
    assert view["state"] == "STOPPED" and view["config"]["job"]["job_id"] == "j1"
    assert failed[-1].state == "failed" and "cannot open" in (failed[-1].error or "")
    print(f"\n{len(want)} frames; progress seen {[(p.state, p.frames_done) for p in seen]}")


async def test_every_frame_once_when_moved_and_when_the_worker_dies(
    secret: str, media: Media, tmp_path: Path, prefix: str
) -> None:
    clip = media.h264_clip()  # 43 s: ~215 frames at 5 fps
    sidecar = tmp_path / "clip.j3.jsonl"
    body = task("j3", clip, sidecar)
    want = expected_pts(clip, FPS)

    with workers(secret, "gpu-a", "gpu-b") as procs:
        async with ingest(secret, tmp_path, prefix) as (service, http, _):
            await place(http, procs["gpu-a"], body)
            await frames_done_at_least(prefix, "j3", len(want) // 5)
            await place(http, procs["gpu-b"], body)  # moved while A is healthy
            await frames_done_at_least(prefix, "j3", len(want) // 2)
            # the spot worker is gone, frames in flight with it
            await asyncio.to_thread(procs["gpu-b"].kill)
            await asyncio.sleep(0.3)
            await place(http, procs["gpu-a"], body)  # the orchestrator places it again
            seen = await until_done(prefix, "j3", 120)
            described = service.streams["job-j3-0"].describe()
            counters = {k: int(str(described[k])) for k in ("disconnected", "timeout", "sent")}
    got = sidecar_pts(sidecar)
    assert seen[-1].state == "done", seen[-1]
    assert counters["disconnected"] + counters["timeout"] > 0  # frames were lost on the way
    assert len(got) == len(set(got)), "a frame twice in the sidecar"
    assert sorted(got) == want, f"missing {sorted(set(want) - set(got))[:5]}"
    print(f"\n{len(want)} frames once; sent {counters['sent']}, lost in flight "
          f"{counters['disconnected'] + counters['timeout']}")  # fmt: skip


class IngestProcess:
    """``framerelay ingest`` with one job task in its streams file."""

    def __init__(self, env: dict[str, str], streams: Path, worker: LocalWorker, out: Path):
        self.cmd = [sys.executable, "-m", "framerelay", "ingest", "--worker-url", worker.url,
                    "--worker-id", worker.worker_id, "--api-port", str(free_port()),
                    "--streams-file", str(streams), "--out", str(out)]  # fmt: skip
        self.env, self.out = env, out
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> IngestProcess:
        log = self.out.with_suffix(".log").open("wb")
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def sent_pts(self) -> list[int]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [ResultRecord.model_validate_json(x).pts for x in lines]


async def test_an_ingest_killed_mid_task_resumes_from_the_checkpoint(
    local_worker: LocalWorker, secret: str, media: Media, tmp_path: Path, prefix: str
) -> None:
    clip = media.h264_clip()
    sidecar = tmp_path / "clip.j4.jsonl"
    streams = tmp_path / "streams.json"
    streams.write_text(json.dumps([task("j4", clip, sidecar)]))
    env = service_env()
    env |= {
        "FRAMERELAY_TOKEN_SECRETS": secret,
        "FRAMERELAY_REDIS_URL": REDIS_URL,
        "FRAMERELAY_INGEST_RESULTS__REDIS_PREFIX": prefix,
        "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "store.json"),
        "FRAMERELAY_INGEST_JOB_SIDECAR_DIRS": json.dumps([str(tmp_path)]),
    }
    want = expected_pts(clip, FPS)

    with IngestProcess(env, streams, local_worker, tmp_path / "first.jsonl") as ingest1:
        await frames_done_at_least(prefix, "j4", len(want) // 3, 90 * TIMEOUT_FACTOR)
        ingest1.kill()  # no last flush, no last progress
    at = await checkpoint(prefix, "j4")
    assert at is not None and at > 0
    again = IngestProcess(env, streams, local_worker, tmp_path / "second.jsonl")
    started = time.monotonic()
    with IngestProcess(env, streams, local_worker, again.out):
        seen = await until_done(prefix, "j4", 120)
    resent = again.sent_pts()
    got = sidecar_pts(sidecar)
    assert seen[-1].state == "done" and seen[-1].frames_done == len(want)
    assert len(got) == len(set(got)) and sorted(got) == want
    assert resent and min(resent) >= at, "the restarted ingest sent frames below the checkpoint"
    took = time.monotonic() - started
    print(
        f"\nkilled at checkpoint PTS {at} ({sum(p < at for p in want)}/{len(want)} frames); "
        f"the second ingest sent {len(resent)} frames, done in {took:.1f} s"
    )


async def test_a_new_definition_or_a_removal_mid_task_keeps_every_frame_once(
    local_worker: LocalWorker, secret: str, media: Media, tmp_path: Path, prefix: str
) -> None:
    clip = media.short("mp4")
    fps = 10.0
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    body_a, body_b = task("j5", clip, a, fps=fps), task("j6", clip, b, fps=fps)
    want = expected_pts(clip, fps)

    async with ingest(secret, tmp_path, prefix) as (_, http, _):
        await place(http, local_worker, body_a)
        await place(http, local_worker, body_b)
        await frames_done_at_least(prefix, "j5", len(want) // 4)
        r = await http.put("/v1/streams/job-j5-0", json={**body_a, "jpeg_quality": 80})
        assert r.status_code == 200, r.text  # a new definition: the next epoch takes over
        await frames_done_at_least(prefix, "j6", len(want) // 4)
        assert (await http.delete("/v1/streams/job-j6-0/worker")).status_code == 200
        await asyncio.sleep(1.0)
        stopped = await progress(prefix, "j6")
        await place(http, local_worker, body_b)  # placed again: resumes
        done_a, done_b = await until_done(prefix, "j5", 60), await until_done(prefix, "j6", 60)
    assert stopped is not None and stopped.state == "pending" and stopped.checkpoint_pts
    for path, seen in ((a, done_a), (b, done_b)):
        got = sidecar_pts(path)
        assert seen[-1].state == "done" and seen[-1].frames_done == len(want)
        assert len(got) == len(set(got)) and sorted(got) == want
