"""Dynamic batching across tunnels, inference and tracking off the event loop.

Frames wait in one lane per tunnel (:mod:`gpu_worker.lanes`): bounded, served
round-robin, so one tunnel's flood cannot crowd out another. The batcher takes
up to ``max_batch`` frames (one per lane in turn; optionally waiting
``batch_wait_ms`` to fill a batch), runs detection and then each frame's
tracker in a single inference thread, and hands each result back to its
connection. Per-stream order is kept: a stream's frames share a lane (FIFO)
and a batch is processed in the order it was taken.

The loop is supervised. An exception from the detector fails that batch only
(each frame is retried alone first when the batch held several, so one bad
frame cannot fail the others): its frames are answered ``inference_error``.
An exception from one frame's tracker fails that frame (``track_error``) and
resets that stream's tracker. Either is counted and logged (once per distinct
error per minute), and the loop carries on. The loop stamps a
:class:`~gpu_worker.watchdog.Heartbeat` around each batch for the watchdog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec
import numpy as np
from numpy.typing import NDArray

from framerelay import wire
from framerelay.detections import Detections
from framerelay.errors import ProtocolError
from framerelay.geometry import Letterbox
from framerelay.outbox import corked
from gpu_worker.detectors import Detector, ModelInput
from gpu_worker.faults import FaultInjector
from gpu_worker.jpeg_batch import BatchJpegDecoder
from gpu_worker.lanes import Lanes
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.sessions import StreamSession
from gpu_worker.watchdog import Heartbeat

log = logging.getLogger(__name__)
LOG_REPEAT_S = 60.0


@dataclass(frozen=True, slots=True)
class Failure:
    """A frame the loop could not process: answered with an ERROR ``code``."""

    code: str
    message: str


Reply = tuple[wire.Result, bytes] | tuple[wire.Snapshot, bytes]
"""A message for the tunnel: its header and payload (the tunnel's protocol encodes it)."""
Outcome = list[Reply] | Failure
"""The RESULT (and a due SNAPSHOT), or why the frame failed."""


@dataclass(slots=True)
class WorkItem:
    frame: wire.Frame
    image: NDArray[np.uint8] | None
    """Decoded; None while ``jpeg`` waits for the batcher's decode stage."""
    session: StreamSession
    reply: Callable[[WorkItem, Outcome], None]
    """Called on the event loop with the frame's outcome."""
    received_at: float
    decoded_at: float
    lane: int = 0
    jpeg: bytes | memoryview | None = None
    """The payload, until the decode stage turns it into ``image``."""
    taken_before: int = 0
    """The frames the batcher had taken from the lanes when this one was queued."""
    frames_ahead: int = 0
    """The frames it took between this one's queueing and this one (other tunnels' and
    this tunnel's own earlier ones; the ``frames_ahead`` timing): the round-robin lanes
    keep it small for one tunnel whatever another floods."""


Decoded = tuple[list[WorkItem], list[Failure | None]]
"""A batch out of the decode stage, with each item's failure (None: decoded)."""


class ErrorLog:
    """Logs each distinct error once, then at most once per ``repeat_s`` with a count."""

    def __init__(self, repeat_s: float = LOG_REPEAT_S, max_keys: int = 256) -> None:
        self.repeat_s = repeat_s
        self.max_keys = max_keys
        self._seen: dict[str, tuple[float, int]] = {}  # key -> (last logged, suppressed)

    def report(self, what: str, exc: BaseException, now: float | None = None) -> bool:
        """Log ``exc`` unless it was logged lately; True when it was logged."""
        now = time.monotonic() if now is None else now
        key = f"{what}|{type(exc).__name__}|{exc}"[:500]
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.repeat_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is None and len(self._seen) >= self.max_keys:
            self._seen.pop(next(iter(self._seen)))
        more = f" ({last[1]} more like it since)" if last and last[1] else ""
        log.error(
            "%s: %s: %s%s", what, type(exc).__name__, exc, more, exc_info=None if last else exc
        )
        self._seen[key] = (now, 0)
        return True


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
        decoder: BatchJpegDecoder | None = None,
    ) -> None:
        self.detector = detector
        self.decoder = decoder
        """The decode stage's decoder; None: frames arrive decoded (``submit`` them so)."""
        self.metrics = metrics
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self.heartbeat = Heartbeat()
        self.errors = ErrorLog()
        self._lanes: Lanes[WorkItem] = Lanes(capacity)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="infer")
        self._decode_executor = ThreadPoolExecutor(1, thread_name_prefix="decode-stage")
        self.faults = faults or FaultInjector(None)  # test-only hook (gpu_worker/faults.py)

    @property
    def inference_thread(self) -> ThreadPoolExecutor:
        """The one thread that runs the detector (warm-ups belong there too)."""
        return self._executor

    def open_lane(self) -> int:
        """A lane for a new tunnel; its frames carry the key in ``WorkItem.lane``."""
        return self._lanes.open()

    def close_lane(self, key: int) -> None:
        """The tunnel closed: drop what it still had queued."""
        dropped = self._lanes.close(key)
        if dropped:
            self.metrics.drops.labels("closed").inc(len(dropped))
        self.metrics.queue_depth.set(len(self._lanes))

    def has_room(self, lane: int) -> bool:
        """Whether ``submit`` would now accept a frame of this lane."""
        return self._lanes.has_room(lane)

    def submit(self, item: WorkItem) -> bool:
        """Queue a frame; False when its lane is full (the caller replies 'capacity')."""
        if not self._lanes.put(item.lane, item, item.frame.stream_id):
            return False
        item.taken_before = self._lanes.taken
        self.metrics.queue_depth.set(len(self._lanes))
        return True

    async def run(self) -> None:
        try:
            if self.decoder is None:
                while True:
                    batch = await self._collect()
                    self.heartbeat.started(time.monotonic())
                    await self._infer_and_deliver(batch, [None] * len(batch))
            else:  # two stages: the next batch decodes while this one infers
                decoded: asyncio.Queue[Decoded] = asyncio.Queue(maxsize=1)
                async with asyncio.TaskGroup() as stages:
                    stages.create_task(self._decode_stage(self.decoder, decoded))
                    stages.create_task(self._infer_stage(decoded))
        finally:
            self.faults.release()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._decode_executor.shutdown(wait=False, cancel_futures=True)

    async def _decode_stage(self, decoder: BatchJpegDecoder, out: asyncio.Queue[Decoded]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            self.heartbeat.started(time.monotonic())
            try:
                failed = await loop.run_in_executor(
                    self._decode_executor, self._decode, decoder, batch
                )
            except Exception as exc:  # a bug in the decoder: fail the batch, keep the loop
                self.errors.report("decode stage", exc)
                failed = [Failure("decode_error", _describe(exc))] * len(batch)
            for item, failure in zip(batch, failed, strict=True):
                if failure is None:
                    ms = (item.decoded_at - item.received_at) * 1000
                    self.metrics.stage_ms.labels("decode").observe(ms)
            await out.put((batch, failed))

    async def _infer_stage(self, decoded: asyncio.Queue[Decoded]) -> None:
        while True:
            batch, failed = await decoded.get()
            await self._infer_and_deliver(batch, failed)

    def _decode(self, decoder: BatchJpegDecoder, batch: list[WorkItem]) -> list[Failure | None]:
        """Blocking (decode stage thread): each item's image, or why it has none."""
        w, h = self.detector.input_size
        images = decoder.decode([bytes(it.jpeg or b"") for it in batch], w, h)
        now = time.monotonic()
        failed: list[Failure | None] = []
        for item, image in zip(batch, images, strict=True):
            item.jpeg = None
            if isinstance(image, ProtocolError):
                failed.append(Failure("bad_image", str(image)))
            else:
                item.image, item.decoded_at = image, now
                failed.append(None)
        return failed

    async def _infer_and_deliver(self, batch: list[WorkItem], failed: list[Failure | None]) -> None:
        """Infer the batch's decoded frames (the heartbeat was started for the batch)."""
        good = [item for item, f in zip(batch, failed, strict=True) if f is None]
        loop = asyncio.get_running_loop()
        try:
            done = await loop.run_in_executor(self._executor, self.process, good) if good else []
        except Exception as exc:  # a bug in process(): fail the batch, keep the loop
            self.errors.report("inference loop", exc)
            done = [Failure("inference_error", _describe(exc))] * len(good)
        finally:
            self.heartbeat.finished(time.monotonic())
        results = iter(done)
        self._deliver(batch, [f if f is not None else next(results) for f in failed])

    def _deliver(self, batch: list[WorkItem], outcomes: list[Outcome]) -> None:
        """Each frame's answer to its connection; a connection's answers to one batch share
        a write (:func:`framerelay.outbox.corked`)."""
        with corked():
            for item, outcome in zip(batch, outcomes, strict=True):
                try:
                    item.reply(item, outcome)
                except Exception as exc:  # one connection's bug must not end the loop
                    self.errors.report("delivering a result", exc)

    def _take(self, n: int) -> list[WorkItem]:
        """Up to ``n`` frames from the lanes, each stamped with the frames taken before it
        since it was queued."""
        first = self._lanes.taken
        taken = self._lanes.take(n)
        for i, item in enumerate(taken):
            item.frames_ahead = first + i - item.taken_before
        return taken

    async def _collect(self) -> list[WorkItem]:
        await self._lanes.wait()
        batch = self._take(self.max_batch)
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._lanes.wait()
            except TimeoutError:
                break
            batch += self._take(self.max_batch - len(batch))
        self.metrics.queue_depth.set(len(self._lanes))
        return batch

    def process(self, batch: list[WorkItem]) -> list[Outcome]:
        """Blocking: detect, track, encode results and due snapshots (inference thread)."""
        started = time.monotonic()
        detections = self._detect(batch)
        infer_ms = (time.monotonic() - started) * 1000
        self.metrics.batch_size.observe(len(batch))
        self.metrics.stage_ms.labels("infer").observe(infer_ms)
        return [
            det if isinstance(det, Failure) else self._track(item, det, started, infer_ms, batch)
            for item, det in zip(batch, detections, strict=True)
        ]

    def _detect(self, batch: list[WorkItem]) -> list[Detections | Failure]:
        """The detector's output per frame; a failed batch is retried frame by frame."""
        try:
            return list(self._infer(batch))
        except Exception as exc:
            failure = self._infer_failed(exc)
            if len(batch) == 1:
                return [failure]
        out: list[Detections | Failure] = []
        for item in batch:
            try:
                out += self._infer([item])
            except Exception as exc:
                out.append(self._infer_failed(exc))
        return out

    def _infer(self, items: list[WorkItem]) -> list[Detections]:
        """Each frame through its stream's model: one run per model in the batch."""
        self.faults.before_infer()  # no-op unless test_fault is set (tests)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(id(item.session.model), []).append(i)
        out: list[Detections] = [Detections.empty()] * len(items)
        for idx in groups.values():
            served = items[idx[0]].session.model
            # the default model (pinned) is this batcher's own detector
            detector = self.detector if served is None or served.pinned else served.detector()
            for i, det in zip(idx, self._run(detector, [items[i] for i in idx]), strict=True):
                out[i] = det
        return out

    @staticmethod
    def _run(detector: Detector, items: list[WorkItem]) -> list[Detections]:
        size = detector.input_size
        inputs = [ModelInput(_image(it), _letterbox(it.frame, size)) for it in items]
        out = detector.infer(inputs)
        if len(out) != len(items):
            raise RuntimeError(f"the detector returned {len(out)} results for {len(items)} images")
        return out

    def _infer_failed(self, exc: Exception) -> Failure:
        self.metrics.batch_errors.labels("infer").inc()
        self.errors.report("inference failed", exc)
        return Failure("inference_error", f"inference failed: {_describe(exc)}")

    def _track(
        self,
        item: WorkItem,
        det: Detections,
        started: float,
        infer_ms: float,
        batch: list[WorkItem],
    ) -> Outcome:
        """Track one frame and encode its messages; a failure resets its stream's tracker."""
        try:
            self.faults.before_track()  # no-op unless test_fault is set (tests)
            t0 = time.monotonic()
            tracked = item.session.track(item.frame, det)
            track_ms = (time.monotonic() - t0) * 1000
            timings = {
                "decode_ms": (item.decoded_at - item.received_at) * 1000,
                "queue_ms": (started - item.decoded_at) * 1000,
                "infer_ms": infer_ms,
                "track_ms": track_ms,
                "batch": float(len(batch)),
                "frames_ahead": float(item.frames_ahead),
                "worker_ms": (time.monotonic() - item.received_at) * 1000,
            }
            model = item.session.model
            name = msgspec.UNSET if model is None else model.name
            messages: list[Reply] = [_result(item.frame, tracked, timings, name)]
            if item.session.snapshot_due(tracked):
                messages.append(_snapshot(item))
        except Exception as exc:
            item.session.reset()
            self.metrics.batch_errors.labels("track").inc()
            self.errors.report(f"tracking failed (stream {item.session.stream_id})", exc)
            return Failure("track_error", f"tracking failed, tracker reset: {_describe(exc)}")
        self.metrics.stage_ms.labels("track").observe(track_ms)
        self.metrics.stage_ms.labels("queue").observe(timings["queue_ms"])
        return messages


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _image(item: WorkItem) -> NDArray[np.uint8]:
    if item.image is None:
        raise RuntimeError(f"frame {item.frame.seq} of {item.frame.stream_id} was not decoded")
    return item.image


def _letterbox(f: wire.Frame, size: tuple[int, int]) -> Letterbox:
    return Letterbox(f.src_w, f.src_h, size[0], size[1], f.scale)


def _snapshot(item: WorkItem) -> Reply:
    session = item.session
    header = wire.Snapshot(stream_id=session.stream_id, seq=item.frame.seq, clock=session.clock)
    return header, session.tracker.snapshot()


def _result(
    f: wire.Frame, det: Detections, timings: dict[str, float], model: str | msgspec.UnsetType
) -> Reply:
    header = wire.Result.of(f, n=len(det), timings=timings, model=model)
    return header, wire.pack_detections(det)
