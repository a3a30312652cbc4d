"""Frames to a RunPod serverless endpoint in batches, detections back: the tunnel's stand-in.

A job task on a serverless tier sends its prepared frames (letterboxed model-input JPEGs,
:mod:`ingest.prepare`, each with its :class:`framerelay.wire.Timing`) here instead of
over a tunnel. :meth:`ServerlessSink.put` adds a frame to the open batch; a batch goes
out as one serverless job (:mod:`ingest.serverless_link`, the input that
:mod:`gpu_worker.serverless` takes) when it holds ``max_frames`` frames or its body
would pass ``max_body_bytes`` (under RunPod's 10 MB ``/run`` limit). At most
``max_jobs`` jobs are out at once: :meth:`put` waits for one to end (bounded, never
queued without limit). Each batch's answer is checked (one result per frame, same PTS,
finite boxes) and handed to ``on_results`` in the batch's frame order; batches may end
in any order.

A job that fails (``FAILED``, ``TIMED_OUT``, a deadline, an endpoint that stays
unreachable through the link's own retries) is submitted again, up to ``attempts``
times. A batch that still fails, or whose answer is unusable (a frame the handler could
not read, a malformed output), is *lost*: ``on_lost(batch, error)`` is called and the
sink goes on (a job task then reads its input again from its checkpoint); without
``on_lost`` the sink fails with that error instead (:meth:`drain` raises it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from framerelay import wire
from framerelay.detections import Detections
from ingest.prepare import Prepared
from ingest.serverless_link import RUN_MAX_BYTES, ServerlessError, ServerlessLink

log = logging.getLogger(__name__)
_FRAME_OVERHEAD = 160
"""JSON bytes of one frame besides its base64 (keys, numbers)."""
_BODY_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class SinkFrame:
    """One prepared frame and its timing (carried back with its result)."""

    timing: wire.Timing
    prepared: Prepared

    def as_input(self) -> dict[str, Any]:
        lb = self.prepared.letterbox
        data = base64.b64encode(self.prepared.data).decode()
        return {"pts": self.timing.pts, "src_w": lb.src_w, "src_h": lb.src_h,
                "scale": lb.scale, "jpeg_b64": data}  # fmt: skip

    @property
    def body_bytes(self) -> int:
        return (len(self.prepared.data) + 2) // 3 * 4 + _FRAME_OVERHEAD


@dataclass(frozen=True, slots=True)
class FrameResult:
    """Detections of one frame (boxes in source pixels, untracked)."""

    frame: SinkFrame
    detections: Detections
    model: str
    class_names: tuple[str, ...]
    worker_id: str
    timings: dict[str, float] = field(default_factory=dict)


OnResults = Callable[[list[FrameResult]], Awaitable[None]]
OnLost = Callable[[list[SinkFrame], ServerlessError], None]


class _OneResult(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    pts: int
    xyxy: list[tuple[float, float, float, float]] = Field(default_factory=list)
    confidence: list[float] = Field(default_factory=list)
    class_id: list[int] = Field(default_factory=list)
    error: str | None = Field(None, max_length=1000)


class _Output(BaseModel):
    """A handler's output as read here (a peer's: unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    model: str = Field(max_length=64)
    worker_id: str = Field("", max_length=128)
    class_names: list[str] = Field(default_factory=list, max_length=10_000)
    results: list[_OneResult]
    timings: dict[str, float] = Field(default_factory=dict, max_length=32)


class ServerlessSink:
    """Batches frames into serverless jobs; see the module."""

    def __init__(
        self,
        link: ServerlessLink,
        on_results: OnResults,
        *,
        model: str | None = None,
        max_frames: int = 32,
        max_body_bytes: int = RUN_MAX_BYTES * 9 // 10,
        max_jobs: int = 4,
        attempts: int = 3,
        on_lost: OnLost | None = None,
    ) -> None:
        if not 1 <= max_frames <= 512 or max_jobs < 1 or attempts < 1:
            raise ValueError("need 1 <= max_frames <= 512, max_jobs >= 1, attempts >= 1")
        if not _BODY_OVERHEAD < max_body_bytes <= RUN_MAX_BYTES:
            raise ValueError(f"max_body_bytes must be at most {RUN_MAX_BYTES}")
        self.link = link
        self.on_results = on_results
        self.model = model
        self.max_frames = max_frames
        self.max_body_bytes = max_body_bytes
        self.attempts = attempts
        self.on_lost = on_lost
        self._batch: list[SinkFrame] = []
        self._batch_bytes = _BODY_OVERHEAD
        self._slots = asyncio.Semaphore(max_jobs)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self.jobs = 0
        self.resubmits = 0
        self.frames_answered = 0
        self.batches_lost = 0

    async def put(self, frame: SinkFrame) -> None:
        """Add ``frame`` (sends the batch first when it would be too big; may wait)."""
        self._check()
        if frame.body_bytes + _BODY_OVERHEAD > self.max_body_bytes:
            raise ServerlessError(
                f"frame pts {frame.timing.pts}: its JPEG alone is over the /run body limit"
            )
        if self._batch and self._batch_bytes + frame.body_bytes > self.max_body_bytes:
            await self.flush()
        self._batch.append(frame)
        self._batch_bytes += frame.body_bytes
        if len(self._batch) >= self.max_frames:
            await self.flush()

    async def flush(self) -> None:
        """Send the open batch (waits for a free job slot)."""
        if not self._batch:
            return
        batch, self._batch, self._batch_bytes = self._batch, [], _BODY_OVERHEAD
        await self._slots.acquire()
        self._check_releasing()
        task = asyncio.create_task(self._job(batch), name="serverless-job")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def drain(self) -> None:
        """Send what is open and wait for every job; raises the first failure."""
        await self.flush()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        self._check()

    async def aclose(self) -> None:
        """Stop: cancel the jobs still out (the link cancels them on the endpoint)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _check_releasing(self) -> None:
        if self._failure is not None:
            self._slots.release()
            raise self._failure

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    async def _job(self, batch: list[SinkFrame]) -> None:
        try:
            results = parse_output(await self._answer(batch), batch)
        except ServerlessError as exc:
            if self.on_lost is None:
                raise
            self.batches_lost += 1
            log.warning("serverless batch of %d frames lost: %s", len(batch), exc)
            self.on_lost(batch, exc)
            return
        self.frames_answered += len(batch)
        await self.on_results(results)

    async def _answer(self, batch: list[SinkFrame]) -> object:
        """The batch's job output, submitting it again after a failure (``attempts``)."""
        job_input: dict[str, Any] = {"frames": [f.as_input() for f in batch]}
        if self.model is not None:
            job_input["model"] = self.model
        for attempt in range(1, self.attempts + 1):
            try:
                self.jobs += 1
                return await self.link.run(job_input)
            except ServerlessError as exc:
                if attempt == self.attempts:
                    raise ServerlessError(
                        f"a batch of {len(batch)} frames failed {attempt} times: {exc}"
                    ) from None
                self.resubmits += 1
                log.warning("serverless batch (%d frames) failed, submitting again: %s",
                            len(batch), exc)  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover


def parse_output(output: object, batch: Sequence[SinkFrame]) -> list[FrameResult]:
    """The batch's results from a handler's output; ServerlessError when it does not
    answer every frame of ``batch`` in order, or a frame's error."""
    try:
        out = _Output.model_validate(output)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ServerlessError(
            f"the handler's output is malformed at {where}: {first['msg']}"
        ) from None
    if len(out.results) != len(batch):
        raise ServerlessError(
            f"the handler answered {len(out.results)} frames of a batch of {len(batch)}"
        )
    names = tuple(out.class_names)
    return [_frame_result(r, f, out, names) for r, f in zip(out.results, batch, strict=True)]


def _frame_result(
    r: _OneResult, frame: SinkFrame, out: _Output, names: tuple[str, ...]
) -> FrameResult:
    if r.pts != frame.timing.pts:
        raise ServerlessError(f"the handler answered pts {r.pts} for frame pts {frame.timing.pts}")
    if r.error is not None:
        raise ServerlessError(f"the worker could not read frame pts {r.pts}: {r.error[:200]}")
    n = len(r.xyxy)
    if len(r.confidence) != n or len(r.class_id) != n:
        raise ServerlessError(f"frame pts {r.pts}: boxes, scores and classes differ in number")
    if any(not math.isfinite(v) or abs(v) > 1e7 for box in r.xyxy for v in box):
        raise ServerlessError(f"frame pts {r.pts}: a box out of range")
    if any(not 0 <= c < 2**31 for c in r.class_id):
        raise ServerlessError(f"frame pts {r.pts}: a class id out of range")
    det = Detections(
        xyxy=np.asarray(r.xyxy, np.float32).reshape(n, 4),
        confidence=np.clip(np.asarray(r.confidence, np.float32), 0.0, 1.0),
        class_id=np.asarray(r.class_id, np.int32),
        tracker_id=np.full(n, -1, np.int64),
    )
    return FrameResult(frame, det, out.model, names, out.worker_id, dict(out.timings))


__all__ = ["FrameResult", "ServerlessSink", "SinkFrame", "parse_output"]
