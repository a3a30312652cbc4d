"""Batch jobs in the orchestrator, piece by piece: inputs as tasks (files, recording
directories, URLs, every refusal), one driver pass (start in order up to max_parallel,
end on the ingest's done/failed, finish, charge), cost shares, the ETA, the placement
weight of a task, and the job store on a real Redis (watched transactions, pruning)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from deploy.job_inputs import InputError, expand_inputs
from deploy.jobs import (
    ALL_FRAMES_FPS,
    Changes,
    JobRecord,
    JobStore,
    TaskRecord,
    advance,
    cancel,
    eta_s,
    job_rates,
    job_view,
    placement_view,
    task_spec,
)
from deploy.models import PodRecord, StreamSpec
from deploy.scaling import tier_targets
from deploy.settings import OrchestratorSettings, TierConfig
from deploy.store import Store
from framerelay.jobs import JobSpec, TaskProgress, progress_key, task_stream_id
from tests.conftest import REDIS_URL
from tests.support.auth import ed_keys


def recording(tmp: Path, segments: list[dict[str, Any]]) -> Path:
    """A recorder directory: index.json and an (empty) file per segment."""
    tmp.mkdir(parents=True, exist_ok=True)
    for seg in segments:
        (tmp / seg["name"]).write_bytes(b"")
    entries = [{"epoch": 0, "start_pts": 0, "state": "complete", **s} for s in segments]
    (tmp / "index.json").write_text(json.dumps({"segments": entries}), encoding="utf-8")
    return tmp


def test_a_recording_directory_is_its_finished_segments_in_time_order(tmp_path: Path) -> None:
    rec = recording(tmp_path / "cam-1", [
        {"name": "c.mp4", "start_wall": 30.0},
        {"name": "a.mp4", "start_wall": 10.0},
        {"name": "live.mp4", "start_wall": 40.0, "state": "recording"},
        {"name": "b.mp4", "start_wall": 20.0, "state": "partial"},
    ])  # fmt: skip
    clip = tmp_path / "other.mp4"
    clip.write_bytes(b"")
    tasks = expand_inputs([str(rec), str(clip)], "j1", None)
    assert [Path(t.url).name for t in tasks] == ["a.mp4", "b.mp4", "c.mp4", "other.mp4"]
    assert tasks[0].sidecar == str(rec / "a.j1.jsonl")  # beside the input
    assert tasks[3].sidecar == str(tmp_path / "other.j1.jsonl")


def test_urls_need_an_output_directory(tmp_path: Path) -> None:
    url = "rtsp://user:pw@cam.local/recordings/night.mp4?token=x"
    with pytest.raises(InputError, match="OUTPUT_DIR") as caught:
        expand_inputs([url], "j1", None)
    assert caught.value.index == 0 and "pw" not in str(caught.value)
    tasks = expand_inputs([url, "https://x/y/"], "j1", tmp_path)
    assert tasks[0].url == url
    assert tasks[0].sidecar == str(tmp_path / "j1" / "0000-night.j1.jsonl")
    assert tasks[1].sidecar == str(tmp_path / "j1" / "0001-y.j1.jsonl")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: ["relative/clip.mp4"], "absolute path"),
        (lambda d: [str(d / "missing.mp4")], "no such file"),
        (lambda d: [str(d)], "no index.json"),
        (lambda d: ["/x/a\nb.mp4"], "control characters"),
        (lambda d: ["/" + "a" * 5000], "characters"),
        (lambda d: [""], "characters"),
    ],
    ids=["relative", "missing", "plain-directory", "control", "long", "empty"],
)
def test_inputs_that_cannot_be_tasks_say_which_and_why(make: Any, why: str, tmp_path: Path) -> None:
    clip = tmp_path / "ok.mp4"
    clip.write_bytes(b"")
    with pytest.raises(InputError, match=why) as caught:
        expand_inputs([str(clip), *make(tmp_path)], "j1", None)
    assert caught.value.index == 1


def test_inputs_outside_the_allowed_directories_are_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.mp4").write_bytes(b"")
    (tmp_path / "b.mp4").write_bytes(b"")
    (tmp_path / "in" / "link.mp4").symlink_to(tmp_path / "b.mp4")
    roots = [tmp_path / "in"]
    ok = expand_inputs([str(tmp_path / "in" / "x" / ".." / "a.mp4")], "j1", None, roots)
    assert ok[0].url == str(tmp_path / "in" / "a.mp4")  # normalised: no '..' in a sidecar
    for bad in (tmp_path / "b.mp4", tmp_path / "in" / ".." / "b.mp4", tmp_path / "in" / "link.mp4"):
        with pytest.raises(InputError, match="INPUT_DIRS"):
            expand_inputs([str(bad)], "j1", None, roots)


def test_a_repeated_input_and_too_many_segments_are_refused(tmp_path: Path) -> None:
    clip = tmp_path / "ok.mp4"
    clip.write_bytes(b"")
    with pytest.raises(InputError, match="repeats task 0"):
        expand_inputs([str(clip), f"file://{clip}"], "j1", None)
    many = recording(tmp_path / "big", [
        {"name": f"s{i:04d}.mp4", "start_wall": float(i)} for i in range(1001)
    ])  # fmt: skip
    with pytest.raises(InputError, match="more than 1000") as caught:
        expand_inputs([str(many)], "j1", None)
    assert caught.value.index is None


@pytest.mark.parametrize(
    "index",
    ["not json", json.dumps({"segments": [{"name": "../etc/passwd", "start_wall": 1,
                                            "epoch": 0, "start_pts": 0}]}),
     json.dumps({"segments": [{"name": "a.mp4"}]}), json.dumps({"nothing": []})],
    ids=["garbage", "escapes", "fields-missing", "no-segments"],
)  # fmt: skip
def test_a_bad_recorder_index_is_refused(index: str, tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(index, encoding="utf-8")
    with pytest.raises(InputError, match="not a recorder index"):
        expand_inputs([str(tmp_path)], "j1", None)


# -- one driver pass ---------------------------------------------------------------------


def job(n: int = 3, **spec: Any) -> JobRecord:
    tasks = [TaskRecord(input=f"/r/s{k}.mp4", sidecar=f"/r/s{k}.j1.jsonl") for k in range(n)]
    return JobRecord(id="j1", spec=JobSpec(inputs=[t.input for t in tasks], **spec),
                     tasks=tasks, submitted_at=100.0)  # fmt: skip


def said(state: str, done: int = 0, total: int | None = None) -> TaskProgress:
    return TaskProgress.model_validate({"state": state, "frames_done": done,
                                        "frames_total": total})  # fmt: skip


def test_tasks_start_in_order_up_to_max_parallel_and_the_next_follows_a_done_one() -> None:
    rec = job(3, max_parallel=2, model="vehicles", fps=0)
    first = advance(rec, [None] * 3, [], 110.0, (0.0, 0.0), 60)
    assert [s.id for s in first.put] == ["job-j1-0", "job-j1-1"] and not first.remove
    assert rec.state == "running" and rec.started_at == 110.0
    spec = first.put[0]
    assert (spec.priority, spec.realtime, spec.loop, spec.fps, spec.model) == (
        "batch",
        False,
        False,
        ALL_FRAMES_FPS,
        "vehicles",
    )
    running = ["job-j1-0", "job-j1-1"]
    nothing = advance(rec, [said("running", 5, 50), None, None], running, 111.0, (0, 0), 60)
    assert not nothing.put and not nothing.remove
    step = advance(rec, [said("done", 50, 50), said("running", 9, 40), None], running, 112.0,
                   (0, 0), 60)  # fmt: skip
    assert step.remove == ["job-j1-0"] and [s.id for s in step.put] == ["job-j1-2"]
    assert rec.tasks[0].state == "done" and rec.state == "running"
    final = [said("done", 50, 50), said("done", 40, 40), said("done", 30, 30)]
    end = advance(rec, final, ["job-j1-1", "job-j1-2"], 120.0, (0, 0), 60)
    assert sorted(end.remove) == ["job-j1-1", "job-j1-2"]
    assert (rec.state, rec.finished_at, rec.error) == ("done", 120.0, None)


def test_a_failed_task_fails_the_job_at_the_end_but_not_the_others() -> None:
    rec = job(2, max_parallel=1)
    advance(rec, [None, None], [], 1.0, (0, 0), 60)
    advance(rec, [said("failed"), None], ["job-j1-0"], 2.0, (0, 0), 60)
    assert rec.state == "running" and rec.tasks[1].state == "running"
    advance(rec, [said("failed"), said("done", 3, 3)], ["job-j1-1"], 3.0, (0, 0), 60)
    assert (rec.state, rec.error) == ("failed", "task 0 failed: no reason given")


def test_a_running_task_whose_stream_went_missing_is_put_back() -> None:
    rec = job(1)
    advance(rec, [None], [], 1.0, (0, 0), 60)
    again = advance(rec, [said("running", 1, 9)], [], 2.0, (0, 0), 60)
    assert [s.id for s in again.put] == ["job-j1-0"]


def test_cost_and_pod_time_accrue_from_the_first_start() -> None:
    rec = job(1)
    advance(rec, [None], [], 10.0, (1.0, 1.0), 60)  # starts: nothing to charge yet
    assert rec.cost_usd == 0.0
    advance(rec, [said("running")], ["job-j1-0"], 14.0, (0.001, 0.5), 60)
    assert rec.cost_usd == pytest.approx(0.004) and rec.pod_seconds == pytest.approx(2.0)
    assert cancel(rec, 15.0) is not None and rec.state == "cancelled"
    assert cancel(rec, 16.0) is None  # ended already


def test_the_eta_comes_from_the_recent_rate_and_unknown_totals_count_as_the_mean() -> None:
    rec = job(2)
    rec.state = "running"
    rec.rate = [(0.0, 0), (10.0, 100)]  # 10 frames/s
    tasks = [said("running", 100, 300), said("pending")]
    assert eta_s(rec, tasks, 100) == pytest.approx(50.0)  # (300 + 300 - 100) / 10
    assert eta_s(rec, [said("running", 100), said("pending")], 100) is None
    view = job_view(rec, [said("running", 100, 300), None], 10.0)
    assert view.frames_done == 100 and view.frames_total is None and view.eta_s == 50.0


def settings(**over: Any) -> OrchestratorSettings:
    tiers = [
        TierConfig(name="ondemand", min_warm=1, max_workers=2, capacity_fps=30),
        TierConfig(name="batch", interruptible=True, batch_only=True, max_workers=4),
    ]
    return OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=tiers,
                                default_capacity_fps=20, **over)  # fmt: skip


def pod(name: str, tier: str, usd: float, *, ready: bool = True, gpus: int = 1) -> PodRecord:
    return PodRecord(name=name, tier=tier, slot=0, gen=0, spot=tier == "batch", ready=ready,
                     provider_id=name, cost_per_hr=usd, gpu_count=gpus)  # fmt: skip


def test_a_job_pays_its_share_of_its_workers_and_of_idle_batch_pods() -> None:
    a, b = job(2), job(1).model_copy(update={"id": "j2"})
    for rec in (a, b):
        advance(rec, [None] * len(rec.tasks), [], 1.0, (0, 0), 60)
    pods = {"fr-batch-0-g0": pod("fr-batch-0-g0", "batch", 3.6),
            "fr-batch-1-g0": pod("fr-batch-1-g0", "batch", 7.2),  # idle: starting up
            "fr-ondemand-0-g0": pod("fr-ondemand-0-g0", "ondemand", 36.0)}  # fmt: skip
    assigned = {"job-j1-0": "fr-batch-0-g0", "job-j1-1": "fr-batch-0-g0",
                "job-j2-0": "fr-batch-0-g0", "cam": "fr-ondemand-0-g0"}  # fmt: skip
    rates = job_rates([a, b], pods, assigned, settings())
    idle = 7.2 / 3600 / 2
    assert rates["j1"][0] == pytest.approx(3.6 / 3600 * 2 / 3 + idle)
    assert rates["j2"][0] == pytest.approx(3.6 / 3600 / 3 + idle)
    assert rates["j1"][1] == pytest.approx(2 / 3 + 0.5)


def test_a_task_weighs_one_whole_worker_in_planning_and_placement() -> None:
    s = settings()
    rec = job(1)
    task = task_spec(rec, 0)
    live = StreamSpec(id="cam", url="rtsp://x", fps=5)
    weighed = placement_view(s, [task, live], {}, {})
    assert weighed[1] is live
    assert weighed[0].fps == pytest.approx(20 * s.target_utilization)  # the default worker
    slow = pod("fr-batch-0-g0", "batch", 1.0)
    slow.capacity_fps = 10.0
    weighed = placement_view(s, [task], {slow.name: slow}, {})
    assert weighed[0].fps == pytest.approx(10 * s.target_utilization)  # the smallest worker


def test_without_the_weighing_a_job_task_would_open_no_pod() -> None:
    """The fix: a task's sampling rate (240 for every frame) fits no 20 fps worker, so the
    scaler planned nothing for it and the job never started; weighed as a worker, it opens
    one pod on the batch-only tier (the on-demand tier takes no batch stream)."""
    s, task = settings(), task_spec(job(1), 0)
    assert tier_targets(s, [task], {}, {}, 0.0) == {"ondemand": 1, "batch": 0}
    weighed = placement_view(s, [task], {}, {})
    assert tier_targets(s, weighed, {}, {}, 0.0) == {"ondemand": 1, "batch": 1}


# -- the store ---------------------------------------------------------------------------


@pytest.mark.integration
async def test_the_store_keeps_jobs_and_a_change_racing_another_is_not_applied() -> None:
    redis = Redis.from_url(REDIS_URL)
    prefix = f"test-jobs-{secrets.token_hex(4)}:"
    store = JobStore(Store(redis, prefix), redis, prefix + "ingest")
    try:
        rec = job(2)
        assert await store.submit(rec) and not await store.submit(rec)
        assert [j.id for j in await store.active()] == ["j1"]
        assert await store.prune(0) == 0  # an active job is never pruned
        await redis.set(
            progress_key(prefix + "ingest", "j1", 1), said("done", 7, 7).model_dump_json()
        )
        assert await store.progress(rec) == [None, said("done", 7, 7)]

        sync = SyncRedis.from_url(REDIS_URL)

        def raced(r: JobRecord) -> Changes | None:  # another writer between read and write
            sync.set(store.key("j1"), r.model_dump_json())
            return advance(r, [None, None], [], 5.0, (0, 0), 60)

        assert await store.change("j1", raced) is None  # not applied: the driver retries
        assert await store.store.streams() == {}
        sync.close()
        after = await store.change("j1", lambda r: advance(r, [None] * 2, [], 5, (0, 0), 60))
        assert after is not None and after.state == "running"
        streams = await store.store.streams()
        assert sorted(streams) == [task_stream_id("j1", 0), task_stream_id("j1", 1)]
        ended = await store.change("j1", lambda r: cancel(r, 6.0))
        assert ended is not None and ended.state == "cancelled"
        assert await store.store.streams() == {}
        assert await store.prune(0) == 1 and await store.ids() == []
        assert await redis.smembers(prefix + "jobs:active") == set()
    finally:
        await store.store.clear()
        await redis.aclose()
