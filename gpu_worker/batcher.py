"""Dynamic batching across streams, inference and tracking off the event loop.

Frames from every connection wait in one bounded queue. The batcher takes
whatever is waiting (up to ``max_batch``; optionally waiting ``batch_wait_ms``
to fill a batch), runs detection and then each frame's tracker in a single
inference thread, and hands each encoded result back to its connection.
Per-stream order is kept: a connection submits its frames in order and a batch
is processed in queue order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from framerelay import wire
from framerelay.detections import Detections
from framerelay.geometry import Letterbox
from gpu_worker.detectors import Detector, ModelInput
from gpu_worker.faults import FaultInjector
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.sessions import StreamSession

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkItem:
    frame: wire.Frame
    image: NDArray[np.uint8]
    session: StreamSession
    reply: Callable[[list[bytes], StreamSession], None]
    received_at: float
    decoded_at: float


class Batcher:
    def __init__(
        self,
        detector: Detector,
        metrics: WorkerMetrics,
        *,
        max_batch: int,
        capacity: int,
        batch_wait_ms: float = 0.0,
        faults: FaultInjector | None = None,
    ) -> None:
        self.detector = detector
        self.metrics = metrics
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self._queue: asyncio.Queue[WorkItem] = asyncio.Queue(maxsize=capacity)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="infer")
        self._faults = faults or FaultInjector(None)  # test-only hook (gpu_worker/faults.py)

    def submit(self, item: WorkItem) -> bool:
        """Queue a frame; False when the queue is full (the caller replies 'capacity')."""
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            return False
        self.metrics.queue_depth.set(self._queue.qsize())
        return True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                batch = await self._collect()
                replies = await loop.run_in_executor(self._executor, self.process, batch)
                for item, payload in zip(batch, replies, strict=True):
                    item.reply(payload, item.session)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _collect(self) -> list[WorkItem]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    batch.append(await self._queue.get())
            except TimeoutError:
                break
        self.metrics.queue_depth.set(self._queue.qsize())
        return batch

    def process(self, batch: list[WorkItem]) -> list[list[bytes]]:
        """Blocking: detect, track, encode results and due snapshots (inference thread)."""
        self._faults.before_batch()  # no-op unless test_fault is set (tests)
        started = time.monotonic()
        size = self.detector.input_size
        inputs = [ModelInput(it.image, _letterbox(it.frame, size)) for it in batch]
        detections = self.detector.infer(inputs)
        infer_ms = (time.monotonic() - started) * 1000
        self.metrics.batch_size.observe(len(batch))
        self.metrics.stage_ms.labels("infer").observe(infer_ms)
        out: list[list[bytes]] = []
        for item, det in zip(batch, detections, strict=True):
            t0 = time.monotonic()
            tracked = item.session.track(item.frame, det)
            track_ms = (time.monotonic() - t0) * 1000
            self.metrics.stage_ms.labels("track").observe(track_ms)
            timings = {
                "decode_ms": (item.decoded_at - item.received_at) * 1000,
                "queue_ms": (started - item.decoded_at) * 1000,
                "infer_ms": infer_ms,
                "track_ms": track_ms,
                "batch": float(len(batch)),
                "worker_ms": (time.monotonic() - item.received_at) * 1000,
            }
            self.metrics.stage_ms.labels("queue").observe(timings["queue_ms"])
            messages = [_encode_result(item.frame, tracked, timings)]
            if item.session.snapshot_due():
                messages.append(_encode_snapshot(item))
            out.append(messages)
        return out


def _letterbox(f: wire.Frame, size: tuple[int, int]) -> Letterbox:
    return Letterbox(f.src_w, f.src_h, size[0], size[1], f.scale, f.pad_x, f.pad_y)


def _encode_snapshot(item: WorkItem) -> bytes:
    session = item.session
    header = wire.Snapshot(stream_id=session.stream_id, seq=item.frame.seq, clock=session.clock)
    return wire.encode(header, session.tracker.snapshot())


def _encode_result(f: wire.Frame, det: Detections, timings: dict[str, float]) -> bytes:
    header = wire.Result(
        stream_id=f.stream_id,
        epoch=f.epoch,
        seq=f.seq,
        pts=f.pts,
        time_base=f.time_base,
        captured_at=f.captured_at,
        n=len(det),
        timings=timings,
    )
    return wire.encode(header, wire.pack_detections(det))
