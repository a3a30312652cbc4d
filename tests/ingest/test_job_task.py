"""A job task's bookkeeping (issue 18), without a worker: the checkpoint, lost frames and
starting over, the sampling rule against PyAV, the sidecar's repair, the config's rules."""

from __future__ import annotations

import math
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import pytest
from pydantic import ValidationError

from framerelay.jobs import JobTask, frame_result_id
from framerelay.results import ResultRecord
from framerelay.schemas import SidecarLine
from framerelay.timeline import frame_ticks
from ingest.job_ledger import MAX_STUCK_REWINDS, Rewind, TaskLedger, TaskStuck, sampled
from ingest.job_sidecar import TaskSidecar, segment_name
from ingest.settings import StreamConfig
from tests.support.media import Media


def _ledger(floor: int | None = None, known: tuple[int, ...] = ()) -> TaskLedger:
    ledger = TaskLedger()
    ledger.begin(floor, known, len(known))
    return ledger


def _send(ledger: TaskLedger, *pts: int) -> list[int]:
    sent = [p for p in pts if ledger.admit(p)]
    for p in sent:
        ledger.offered(p)
    return sent


def _flush(ledger: TaskLedger) -> int | None:
    return ledger.durable(ledger.flushing()).checkpoint


def test_the_checkpoint_stops_at_the_first_frame_not_answered_and_on_disk() -> None:
    ledger = _ledger()
    assert _send(ledger, 0, 10, 20, 30) == [0, 10, 20, 30]
    for p in (0, 20):
        ledger.answered(p)
    assert ledger.durable(frozenset()).checkpoint == 0  # written, not flushed: not yet
    assert _flush(ledger) == 10  # 10 is still in flight
    ledger.answered(10)
    ledger.answered(30)
    figures = ledger.durable(ledger.flushing())
    assert (figures.checkpoint, figures.frames_done, figures.complete) == (31, 4, False)
    ledger.end_of_input()
    assert ledger.durable(frozenset()).complete


def test_lost_frames_start_the_pass_over_at_the_checkpoint_and_skip_what_is_written() -> None:
    ledger = _ledger()
    _send(ledger, 0, 10, 20, 30)
    ledger.answered(0)
    ledger.answered(20)  # 10 and 30 were on the worker that died
    assert _flush(ledger) == 10
    ledger.lost()
    with pytest.raises(Rewind):
        ledger.admit(40)
    # the next pass: the seek lands on a keyframe before the checkpoint
    assert _send(ledger, 0, 10, 20, 30, 40) == [10, 30, 40]
    assert ledger.is_known(20) and ledger.is_known(0) and not ledger.is_known(10)
    for p in (10, 30, 40):
        ledger.answered(p)
    ledger.end_of_input()
    figures = ledger.durable(ledger.flushing())
    assert (figures.checkpoint, figures.frames_done, figures.complete) == (41, 5, True)


def test_a_fresh_pass_never_moves_the_checkpoint_past_a_lost_frame() -> None:
    ledger = _ledger()
    _send(ledger, 100, 120, 150)
    ledger.answered(100)
    ledger.answered(150)  # 120 is lost
    assert _flush(ledger) == 120
    ledger.answered(150)  # a late duplicate
    ledger.lost()
    with pytest.raises(Rewind):
        ledger.admit(120)
    assert _flush(ledger) == 120  # nothing admitted in this pass yet


def test_results_before_the_checkpoint_and_restart_with_known_frames() -> None:
    ledger = _ledger(floor=50, known=(40, 60, 70))
    assert ledger.is_known(10) and ledger.is_known(60) and not ledger.is_known(55)
    assert _send(ledger, 40, 50, 60, 70, 80) == [50, 80]
    assert ledger.frames_done == 3


def test_a_frame_lost_every_time_fails_the_task() -> None:
    ledger = _ledger()
    for _ in range(MAX_STUCK_REWINDS):
        ledger.lost()
        with pytest.raises(Rewind):
            ledger.admit(0)
    ledger.lost()
    with pytest.raises(TaskStuck, match="lost 11 times"):
        ledger.admit(0)


def test_waiting_at_the_end_returns_when_settled_or_rewinds() -> None:
    ledger = _ledger()
    stop = threading.Event()
    ledger.lost()
    with pytest.raises(Rewind):
        ledger.wait_end(stop, poll_s=0.01)
    ledger.settled.set()
    ledger.wait_end(stop, poll_s=0.01)  # returns


@pytest.mark.parametrize("fps", [0.0, 1.0, 2.5, 5.0, 7.0, 25.0, 240.0])
def test_sampling_by_pts_matches_the_first_frame_after_each_period(media: Media, fps: float
                                                                   ) -> None:  # fmt: skip
    with av.open(str(media.short("mp4"))) as c:
        stream = c.streams.video[0]
        assert stream.time_base is not None and stream.average_rate is not None
        tb, rate = Fraction(stream.time_base), float(stream.average_rate)
        pts = [f.pts for f in c.decode(stream) if f.pts is not None]
    step = frame_ticks(rate, tb)
    ours = [p for p in pts if sampled(p, step, tb, fps)]
    # independently: the first frame of each 1/fps period, by the previous frame's time
    f = Fraction(fps)  # exact: 0.2 s is not a float
    expected = [p for i, p in enumerate(pts) if fps <= 0 or i == 0
                or math.floor(p * tb * f) > math.floor(pts[i - 1] * tb * f)]  # fmt: skip
    assert ours == expected
    if 0 < fps < rate:
        assert abs(len(ours) - len(pts) * fps / rate) <= 1


def _record(pts: int) -> ResultRecord:
    return ResultRecord(
        id=None, stream_id="job-j1-0", epoch=0, seq=pts, pts=pts, time_base=(1, 12800),
        pts_time=pts / 12800, captured_at=1.0, received_at=1.1, latency_ms=100.0,
        worker_id="w", detections=[],
    )  # fmt: skip


def test_the_sidecar_repairs_a_torn_line_and_reads_its_frames_back(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "seg.j1.jsonl"
    sidecar = TaskSidecar(path, 3, "seg.mp4")
    assert sidecar.open() == ([], 0)
    for pts in (0, 512):
        sidecar.write(_record(pts))
    sidecar.close()
    with path.open("a") as f:
        f.write('{"v":1,"id":"1024-3","segm')  # a crash mid-line
    again = TaskSidecar(path, 3, "seg.mp4")
    assert again.open() == ([0, 512], 2)
    again.close()
    lines = [SidecarLine.model_validate_json(x) for x in path.read_text().splitlines()]
    assert [x.id for x in lines] == [frame_result_id(3, 0), frame_result_id(3, 512)]
    assert all(x.result.id == x.id and x.segment == "seg.mp4" and x.exact for x in lines)
    assert (lines[1].pts, lines[1].time_base) == (512, (1, 12800))


def test_segment_names() -> None:
    assert segment_name("/rec/cam1/20261205T0530.mp4") == "20261205T0530.mp4"
    assert segment_name("https://host/v/a.mp4?token=x") == "a.mp4"
    assert segment_name("https://host/") is None


JOB = {"job_id": "j1", "index": 0, "sidecar": "/tmp/out/seg.j1.jsonl"}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"realtime": True}, "realtime, loop and live must be false"),
        ({"loop": True}, "realtime, loop and live must be false"),
        ({"live": True}, "realtime, loop and live must be false"),
        ({"max_frames": 10}, "max_frames 0"),
        ({"url": "rtsp://cam/x"}, "not a live source"),
        ({"job": {**JOB, "sidecar": "out/seg.jsonl"}}, "absolute path ending in .jsonl"),
        ({"job": {**JOB, "sidecar": "/tmp/seg.json"}}, "absolute path"),
        ({"job": {**JOB, "sidecar": "/tmp/../etc/x.jsonl"}}, "without '..'"),
        ({"job": {**JOB, "job_id": "J!"}}, "job.job_id"),
    ],
)
def test_a_job_task_refuses_what_it_cannot_honour(change: dict[str, Any], says: str) -> None:
    fields = {"id": "job-j1-0", "url": "/rec/seg.mp4", "fps": 0, "job": JOB, **change}
    with pytest.raises(ValidationError) as err:
        StreamConfig.model_validate(fields)
    assert says in str(err.value)


def test_a_job_config_round_trips_through_the_store() -> None:
    config = StreamConfig(id="job-j1-0", url="/rec/seg.mp4", fps=0, job=JobTask(**JOB))
    assert StreamConfig.model_validate(config.stored()) == config
    assert {k: config.public()["job"][k] for k in JOB} == JOB


def test_the_orchestrator_passes_its_task_to_the_ingest() -> None:
    from deploy.ingest_link import stream_config  # the orchestrator's side of the contract
    from deploy.models import StreamSpec

    spec = StreamSpec(id="job-j1-0", url="/rec/seg.mp4", priority="batch", fps=240,
                      realtime=False, job=JobTask(**JOB))  # fmt: skip
    config = StreamConfig.model_validate(stream_config(spec))
    assert config.job == spec.job and not config.realtime
    assert "job" not in stream_config(StreamSpec(id="cam", url="/rec/seg.mp4"))
    with pytest.raises(ValidationError, match="realtime and loop false"):
        StreamSpec(id="job-j1-0", url="/rec/seg.mp4", job=JobTask(**JOB))
