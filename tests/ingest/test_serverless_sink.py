"""The serverless sink: frames batched into jobs on the contract server, answers checked.

The handler is a plain function (one box per frame; the real model runs in
tests/integration/test_serverless_job.py), so what is checked is the batching (by count
and by body size), the bound on jobs out at once, resubmitting a failed job, a batch
lost for good, and the checks on a handler's answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from framerelay import wire
from framerelay.geometry import Letterbox
from ingest.prepare import Prepared
from ingest.serverless_link import ServerlessError, ServerlessLink, ServerlessSettings
from ingest.serverless_sink import FrameResult, ServerlessSink, SinkFrame, parse_output
from tests.conftest import TIMEOUT_FACTOR

KEY = "rp_sink_" + "s" * 24
ENDPOINT = "ep-sink"


class Boxes:
    """One box per frame; records the batch sizes and how many jobs ran at once."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, job: Mapping[str, Any]) -> Any:
        frames = job["input"]["frames"]
        with self._lock:
            self.sizes.append(len(frames))
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self._lock:
            self.running -= 1
        return {"model": "m", "worker_id": "w1", "class_names": ["person"],
                "results": [{"pts": f["pts"], "xyxy": [[1.0, 2.0, 30.0, 40.0]],
                             "confidence": [0.9], "class_id": [0]} for f in frames]}  # fmt: skip


@pytest.fixture
def boxes() -> Boxes:
    return Boxes()


@pytest.fixture
def endpoint(boxes: Boxes) -> Iterator[tuple[EndpointState, str]]:
    state = EndpointState(KEY, boxes, endpoint_id=ENDPOINT, workers=4)
    with running_endpoint(state) as url:
        yield state, url


def _frame(pts: int, size: int = 2000) -> SinkFrame:
    timing = wire.build(wire.Timing, stream_id="job-a-0", epoch=0, seq=pts, pts=pts,
                        time_base=(1, 25), captured_at=1.0)  # fmt: skip
    return SinkFrame(timing, Prepared(b"\xff" * size, Letterbox.fit(640, 480, 416, 416)))


async def _send(url: str, frames: list[SinkFrame], **sink: Any) -> tuple[list[FrameResult], Any]:
    got: list[FrameResult] = []
    lost: list[tuple[list[SinkFrame], ServerlessError]] = []

    async def on_results(results: list[FrameResult]) -> None:
        got.extend(results)

    settings = ServerlessSettings(
        base_url=url, api_key=SecretStr(KEY), poll_initial_s=0.02, poll_max_s=0.1, backoff_s=0.02
    )
    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(settings, ENDPOINT) as link:
            if sink.pop("keep_lost", False):
                sink["on_lost"] = lambda batch, exc: lost.append((batch, exc))
            s = ServerlessSink(link, on_results, **sink)
            for f in frames:
                await s.put(f)
            await s.drain()
    return got, (s, lost)


async def test_batches_by_count_every_frame_once(
    endpoint: tuple[EndpointState, str], boxes: Boxes
) -> None:
    _, url = endpoint
    got, (sink, _) = await _send(url, [_frame(p) for p in range(40)], max_frames=8, max_jobs=4)
    assert sorted(r.frame.timing.pts for r in got) == list(range(40))
    assert sorted(boxes.sizes) == [8] * 5 and sink.jobs == 5
    first = got[0]
    assert first.model == "m" and first.class_names == ("person",) and first.worker_id == "w1"
    assert first.detections.xyxy.tolist() == [[1.0, 2.0, 30.0, 40.0]]
    assert first.detections.tracker_id.tolist() == [-1]


async def test_batches_by_body_size(endpoint: tuple[EndpointState, str], boxes: Boxes) -> None:
    _, url = endpoint
    frames = [_frame(p, size=300_000) for p in range(7)]  # ~400 KB of base64 each
    got, _ = await _send(url, frames, max_frames=64, max_body_bytes=1_000_000)
    assert len(got) == 7
    assert max(boxes.sizes) == 2 and sum(boxes.sizes) == 7


async def test_jobs_out_at_once_are_bounded(
    endpoint: tuple[EndpointState, str], boxes: Boxes
) -> None:
    _, url = endpoint
    got, _ = await _send(url, [_frame(p) for p in range(24)], max_frames=2, max_jobs=2)
    assert len(got) == 24
    assert boxes.most <= 2


async def test_a_failed_job_is_submitted_again(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    state.faults.crash_next_jobs = 1
    state.faults.time_out_next_jobs = 1
    got, (sink, _) = await _send(url, [_frame(p) for p in range(16)], max_frames=8, max_jobs=1)
    assert sorted(r.frame.timing.pts for r in got) == list(range(16))
    assert sink.resubmits == 2


async def test_a_batch_lost_for_good(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    state.faults.crash_next_jobs = 2
    got, (sink, lost) = await _send(url, [_frame(p) for p in range(8)], max_frames=4, max_jobs=1,
                              attempts=2, keep_lost=True)  # fmt: skip
    assert [f.timing.pts for f in lost[0][0]] == [0, 1, 2, 3]
    assert "failed 2 times" in str(lost[0][1])
    assert sorted(r.frame.timing.pts for r in got) == [4, 5, 6, 7]
    assert sink.batches_lost == 1
    state.faults.crash_next_jobs = 2
    with pytest.raises(ServerlessError, match="failed 2 times"):
        await _send(url, [_frame(p) for p in range(4)], max_frames=4, attempts=2)


def _answer(**over: Any) -> dict[str, Any]:
    one = {"pts": 0, "xyxy": [[1.0, 2.0, 3.0, 4.0]], "confidence": [0.5], "class_id": [1]}
    one.update(over)
    return {"model": "m", "class_names": ["a", "b"], "results": [one]}


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        ("nope", "malformed"),
        ({"model": "m", "results": []}, "answered 0 frames of a batch of 1"),
        (_answer(pts=7), "answered pts 7 for frame pts 0"),
        (_answer(error="undecodable JPEG"), "could not read frame pts 0: undecodable JPEG"),
        (_answer(confidence=[0.5, 0.2]), "differ in number"),
        (_answer(xyxy=[[1.0, 2.0, float("nan"), 4.0]]), "malformed"),
        (_answer(xyxy=[[1.0, 2.0, 1e30, 4.0]]), "out of range"),
        (_answer(class_id=[-1]), "class id out of range"),
        (_answer(class_id=[2**40]), "class id out of range"),
    ],
)
def test_answers_are_checked(output: object, problem: str) -> None:
    with pytest.raises(ServerlessError, match=problem):
        parse_output(output, [_frame(0)])


def test_sink_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_frames"):
        ServerlessSink(None, None, max_frames=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerlessSink(None, None, max_body_bytes=20 * 1024 * 1024)  # type: ignore[arg-type]
