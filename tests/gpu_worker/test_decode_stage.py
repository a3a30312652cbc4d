"""The batcher's decode stage (``jpeg_decoder`` ``cpu-batch``; ``nvimgcodec`` on a GPU):
frames reach the batcher as JPEGs and each batch is decoded at once, in a stage before
inference, so the event loop hands off one job per batch instead of one per frame.

A bad image fails its frame alone (``bad_image``, as the per-frame path answers); each
stream's results keep their order; a decoder bug fails its batch and the loop goes on;
the watchdog sees a batch from the start of its decode. Real worker (in-process, real
socket), real ONNX model on CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np
import pytest
import simplejpeg

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from gpu_worker.batcher import Batcher, Failure, Outcome, WorkItem
from gpu_worker.detectors import ModelInput
from gpu_worker.jpeg_batch import CpuBatchDecoder, Decoded, decoder_in_use, stage_decoder
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.sessions import new_session
from gpu_worker.watchdog import Heartbeat
from tests.conftest import TIMEOUT_FACTOR
from tests.gpu_worker.tunnel_rig import JPEG, SIDE, frame, http_get, metric, open_tunnel, settle
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, token

T = TIMEOUT_FACTOR
SMALL_JPEG: bytes = simplejpeg.encode_jpeg(np.zeros((32, 32, 3), np.uint8), colorspace="BGR")


class _GpuProbe(TypedDict):
    gpu_missing: Callable[[], str | None]


def test_which_stage_each_choice_gives() -> None:
    no_gpu: _GpuProbe = {"gpu_missing": lambda: "no NVIDIA driver"}
    assert stage_decoder("cpu") is None  # each frame as it arrives, as before
    assert stage_decoder("auto", **no_gpu) is None
    with_gpu = stage_decoder("auto", gpu_missing=lambda: None)  # faster than nvImageCodec now
    assert isinstance(with_gpu, CpuBatchDecoder) and decoder_in_use(with_gpu) == "cpu-batch"
    batch = stage_decoder("cpu-batch")
    assert isinstance(batch, CpuBatchDecoder)
    assert [decoder_in_use(d) for d in (None, batch)] == ["cpu", "cpu-batch"]
    with pytest.raises(ConfigError, match="auto, cpu, cpu-batch or nvimgcodec"):
        stage_decoder("gpu")
    with pytest.raises(ConfigError, match="nvimgcodec: no NVIDIA driver"):
        stage_decoder("nvimgcodec", **no_gpu)


def test_the_heartbeat_is_busy_from_the_oldest_batch_in_flight() -> None:
    beat = Heartbeat()
    beat.started(10.0)  # batch 1 decodes
    beat.started(11.0)  # batch 2 decodes while batch 1 infers
    assert beat.busy_for(12.0) == 2.0
    beat.finished(12.5)  # batch 1 answered
    assert beat.busy_since == 11.0 and beat.batches == 1
    beat.finished(13.0)
    assert beat.busy_since is None and beat.busy_for(20.0) == 0.0


@pytest.mark.integration
async def test_a_real_worker_decodes_in_batches_and_fails_bad_images_alone(secret: str) -> None:
    async with running_worker(
        secret, jpeg_decoder="cpu-batch", max_batch=4, batch_wait_ms=20, max_inflight=8
    ) as (worker, url):
        assert worker.batcher.decoder is not None
        info = (
            await http_get(
                url.replace("ws://", "http://").removesuffix("/v1/tunnel") + "/info", token(secret)
            )
        ).json()
        assert info["jpeg_decoder"] == "cpu-batch"
        # the capacity is measured on a full batch (issue 14: "for the chosen batch")
        assert info["capacity_batch"] == 4
        assert info["capacity_fps"] == pytest.approx(4000 / info["ms_per_inference"], 0.01)
        async with open_tunnel(url, token(secret)) as tunnel:
            a, b = await tunnel.open_stream("a"), await tunnel.open_stream("b")
            for seq in range(6):
                bad = {2: b"\xff\xd8 not a jpeg", 4: SMALL_JPEG}.get(seq)
                await tunnel.send_frame(frame("a", seq), bad or JPEG)
                await tunnel.send_frame(frame("b", seq))
            await settle(tunnel, ["a", "b"], 30 * T)
            assert [r.seq for r in a.results] == [0, 1, 3, 5]
            assert [(e.code, e.seq) for e in a.errors] == [("bad_image", 2), ("bad_image", 4)]
            assert "32x32" in a.errors[1].message
            assert [r.seq for r in b.results] == list(range(6)) and not b.errors
            assert all(r.timings["batch"] >= 1 for r in a.results + b.results)
            assert tunnel.close_code is None
        text = (
            await http_get(
                url.replace("ws://", "http://").removesuffix("/v1/tunnel") + "/metrics",
                token(secret),
            )
        ).text
        assert metric(text, 'framerelay_worker_drops_total{reason="bad_image"}') == 2
        assert metric(text, 'framerelay_worker_stage_seconds_count{stage="decode"}') == 10


class _Echo:
    """A detector that finds nothing (the stage is what is tested)."""

    input_size = (SIDE, SIDE)
    class_names: tuple[str, ...] = ("person",)
    providers: tuple[str, ...] = ("test",)

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        return [Detections.empty() for _ in batch]


class _Broken:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, items: Sequence[bytes], width: int, height: int) -> list[Decoded]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("decoder bug")
        return CpuBatchDecoder().decode(items, width, height)


async def test_a_decoder_bug_fails_its_batch_and_the_stage_goes_on() -> None:
    decoder = _Broken()
    batcher = Batcher(_Echo(), WorkerMetrics(), max_batch=2, capacity=8, decoder=decoder)
    lane = batcher.open_lane()
    got: list[Any] = []
    session = new_session("s", "none", 0.0, 0.0)

    def reply(item: WorkItem, outcome: Outcome) -> None:
        got.append(outcome)

    def item(seq: int) -> WorkItem:
        return WorkItem(frame("s", seq), None, session, reply, 0.0, 0.0, lane, JPEG)

    task = asyncio.create_task(batcher.run())
    for seq in range(2):
        assert batcher.submit(item(seq))
    await wait_until_async(lambda: len(got) >= 2, 10, "2 results")
    assert batcher.submit(item(2))
    await wait_until_async(lambda: len(got) >= 3, 10, "3 results")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [o.code for o in got[:2]] == ["decode_error"] * 2
    assert all(isinstance(o, Failure) and "decoder bug" in o.message for o in got[:2])
    assert isinstance(got[2], list)  # the next batch: a RESULT
