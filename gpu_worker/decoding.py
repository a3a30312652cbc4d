"""JPEG decoding of one tunnel's frames: in parallel, handed on in each stream's order.

The receive loop starts a frame's decode in the worker's decode pool and goes
on reading (it used to await each decode, so one tunnel never used more than
one decode thread). At most ``limit`` decodes of a tunnel run or wait at once;
past that :meth:`OrderedDecoder.start` waits for the oldest to finish, so the
payloads held stay bounded and TCP pushes back on a fast sender. Finished
decodes are handed on (``deliver``) in the order their frames arrived *per
stream* (a later frame of a stream waits for an earlier one), so a stream's
frames reach the batcher, and its results the ingest, in order.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from framerelay import wire
from framerelay.errors import ProtocolError
from gpu_worker.images import decode_jpeg_bgr
from gpu_worker.sessions import StreamSession

log = logging.getLogger(__name__)
Image = NDArray[np.uint8]


@dataclass(slots=True)
class Decoding:
    """One frame being decoded."""

    frame: wire.Frame
    session: StreamSession
    received_at: float
    future: asyncio.Future[Image]
    decoded_at: float = 0.0


Deliver = Callable[[Decoding, Image | ProtocolError], None]
"""Called on the event loop with a decoded frame, in its stream's order (the image, or
why it could not be decoded)."""


class OrderedDecoder:
    def __init__(self, pool: Executor, size: tuple[int, int], limit: int, deliver: Deliver) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._pool = pool
        self._size = size
        self.limit = limit
        self._deliver = deliver
        self._streams: dict[str, collections.deque[Decoding]] = {}
        self._running: set[asyncio.Future[Image]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Decodes running or waiting for an earlier frame of their stream."""
        return sum(len(q) for q in self._streams.values())

    async def start(
        self, frame: wire.Frame, payload: bytes | memoryview, session: StreamSession
    ) -> None:
        """Start decoding ``frame`` (waits first while ``limit`` decodes are running)."""
        while len(self._running) >= self.limit and not self._closed:
            await asyncio.wait(set(self._running), return_when=asyncio.FIRST_COMPLETED)
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        w, h = self._size
        future = loop.run_in_executor(self._pool, decode_jpeg_bgr, payload, w, h)
        job = Decoding(frame, session, time.monotonic(), future)
        self._running.add(future)
        self._streams.setdefault(frame.stream_id, collections.deque()).append(job)
        future.add_done_callback(lambda _: self._done(job))

    def close(self) -> None:
        """The tunnel closed: deliver nothing more (running decodes finish unseen)."""
        self._closed = True
        self._streams.clear()

    def _done(self, job: Decoding) -> None:
        self._running.discard(job.future)
        job.decoded_at = time.monotonic()
        queue = self._streams.get(job.frame.stream_id)
        while queue and queue[0].future.done():
            self._hand_on(queue.popleft())
        if queue is not None and not queue:
            del self._streams[job.frame.stream_id]

    def _hand_on(self, job: Decoding) -> None:
        job.decoded_at = job.decoded_at or time.monotonic()  # done, its callback not run yet
        if self._closed or job.future.cancelled():
            return
        exc = job.future.exception()
        outcome: Image | ProtocolError
        if exc is None:
            outcome = job.future.result()
        elif isinstance(exc, ProtocolError):
            outcome = exc
        else:  # the pool shut down, or a bug in the decoder: this frame only
            log.error("decoding a frame of %s failed: %r", job.frame.stream_id, exc)
            outcome = ProtocolError(f"the image could not be decoded: {type(exc).__name__}")
        try:
            self._deliver(job, outcome)
        except Exception:  # the tunnel's bug must not stop the other frames
            log.exception("handing on a decoded frame of %s failed", job.frame.stream_id)
