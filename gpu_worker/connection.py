"""One authenticated tunnel: many streams multiplexed on one WebSocket.

The receive loop validates every message; a malformed one closes only this
connection (with the protocol error as the close reason). Per-frame problems
(a FRAME header that is invalid but names its stream and seq, an undecodable
image, an unknown stream, credit exceeded, a full lane, a failed inference or
tracker update) are answered with an ERROR for that frame, which returns the
sender's credit. A correct ingest never sends a bad header or image: a tunnel
sending more than ``max_bad_frames_per_s`` of them in a second is closed (1008).
Frames are decoded in parallel across the decode pool, up to
``decode_threads`` per tunnel (:mod:`gpu_worker.decoding`), and reach the
batcher in their stream's order; or, with a batch decoder (``jpeg_decoder``
``cpu-batch`` or ``nvimgcodec``), they go to the batcher as JPEGs and its
decode stage decodes each batch at once. Results leave through a bounded
:class:`~framerelay.outbox.Outbox` with a send timeout, so a peer that stops
reading is cut off instead of stalling the worker; what waits there together (a
batch's results) goes out in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from framerelay import wire
from framerelay.errors import (
    CapacityError,
    ConfigError,
    FramerelayError,
    ModelError,
    ProtocolError,
)
from framerelay.outbox import Outbox, OutboxFull
from framerelay.protocol import (
    FrameReceived,
    ProtocolViolation,
    Refused,
    StreamClosed,
    StreamOpened,
    WorkerEvent,
    WorkerProtocol,
    WorkerState,
)
from gpu_worker.batcher import Batcher, Failure, Outcome, WorkItem
from gpu_worker.budgets import ErrorBudget, Pacer
from gpu_worker.decoding import Decoding, Image, OrderedDecoder
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.model_pool import ModelPool, ServedModel
from gpu_worker.sessions import StreamSession, new_session, resumed_session
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)
SEND_TIMEOUT_S = 10.0
DECODES_PER_THREAD = 1
"""A tunnel's frames decoding at once, per decode thread: one tunnel can use every
thread, and a flooding tunnel puts no more than that ahead of the others in the shared
pool (the rest of its frames wait in TCP)."""
DROP_TIMEOUT_S = 0.5
"""How long a misbehaving peer has to take its ERROR and close frame (it is not read)."""
BAD_FRAME_CODES = frozenset({"bad_frame", "bad_image"})
"""Errors a correct ingest never causes; past the budget the tunnel is closed."""
REFUSED_CODES = BAD_FRAME_CODES | {
    "unknown_stream", "credit_exceeded", "capacity", "too_many_streams", "bad_tracker",
    "bad_snapshot", "unknown_model", "bad_model", "model_capacity",
}  # fmt: skip
"""Refusals the peer can cause as fast as it sends; past the rate it is read slower
(as are OPENs of a stream already open and CLOSEs of a stream that is not)."""
_MODEL_REFUSALS: dict[type[FramerelayError], str] = {
    ConfigError: "unknown_model", ModelError: "bad_model", CapacityError: "model_capacity",
}  # fmt: skip
"""The ERROR code refusing an OPEN, by what the model pool raised."""


class TunnelConnection:
    """Pumps one tunnel's bytes through its :class:`WorkerProtocol` (the rules live
    there) and acts on the events: sessions, decoding, the batcher, budgets, metrics."""

    def __init__(
        self,
        ws: ServerConnection,
        settings: WorkerSettings,
        batcher: Batcher,
        metrics: WorkerMetrics,
        decode_pool: Executor,
        hello: wire.Hello,
        *,
        version: int = wire.VERSION,
        on_fault: Callable[[], None] | None = None,
        models: ModelPool | None = None,
    ) -> None:
        self.ws = ws
        self.models = models
        """The worker's models; None: every stream uses the batcher's detector."""
        self.on_fault = on_fault
        """Called when this tunnel is closed for misbehaving (the server counts it per address)."""
        self.settings = settings
        self.batcher = batcher
        self.metrics = metrics
        self.decode_pool = decode_pool
        self.hello = hello
        self.proto = WorkerProtocol(
            version,
            max_streams=settings.max_streams_per_connection,
            max_inflight=settings.max_inflight,
            limits=wire.Limits(max_payload=settings.max_message_bytes),
        )
        self.sessions: dict[str, StreamSession] = {}
        bound = settings.max_streams_per_connection * settings.max_inflight + 64
        self._out = Outbox(ws, bound)
        self._done = False
        self._lane = batcher.open_lane()
        size = (hello.input_w, hello.input_h)
        limit = DECODES_PER_THREAD * settings.decode_threads
        self._decoder = OrderedDecoder(decode_pool, size, limit, self._decoded)
        self._bad = ErrorBudget(settings.max_bad_frames_per_s)
        self._pacer = Pacer(settings.max_refused_frames_per_s)
        self._abort: str | None = None  # set: close with 1008 after this message
        self._slow = False  # set once it was found not reading its results

    async def close(self, code: int, reason: str) -> None:
        """Close this tunnel (the watchdog's call when inference stalls)."""
        self.proto.close()
        with contextlib.suppress(ConnectionClosed, TimeoutError, OSError):
            await self.ws.close(code, reason[:120])

    async def _drop(self, code: int, reason: str, error: bytes | None = None) -> None:
        """Close a misbehaving peer: stop reading it first (what it sends after this
        costs nothing), send ``error`` (an ERROR) and the close frame, and give it
        :data:`DROP_TIMEOUT_S` before the socket is closed."""
        self.proto.close()
        self.ws.transport.pause_reading()
        if self.on_fault is not None:
            self.on_fault()
        with contextlib.suppress(ConnectionClosed, TimeoutError, OSError):
            async with asyncio.timeout(DROP_TIMEOUT_S):
                if error is not None:
                    await self.ws.send(error)
                await self.ws.close(code, reason[:120])
        self.ws.transport.close()  # flushes what is buffered, reads nothing more

    async def run(self) -> None:
        self.metrics.connections.inc()
        try:
            await self.ws.send(self.proto.send_hello(self.hello))
            sender = asyncio.create_task(self._send_loop())
            try:
                await self._receive_loop()
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
        except ConnectionClosed:
            pass
        finally:
            self._done = True
            self._decoder.close()
            self.proto.close()
            self.batcher.close_lane(self._lane)
            self.metrics.connections.dec()
            self.metrics.streams.dec(len(self.sessions))
            for sid in list(self.sessions):
                self._end_session(sid)

    async def _receive_loop(self) -> None:
        async for data in self.ws:
            for event in self.proto.receive_data(data):
                if isinstance(event, ProtocolViolation):
                    await self._violated(event)
                    return
                await self._handle(event)
            if self._abort is not None:
                await self._drop(wire.CloseCode.POLICY, self._abort)
                return
            await self._pace()

    async def _pace(self) -> None:
        """Past its rate of refused frames, this tunnel waits (TCP pushes back on it)."""
        delay = self._pacer.delay(time.monotonic())
        if delay > 0:
            self.metrics.paced_s.inc(delay)
            await asyncio.sleep(delay)

    async def _violated(self, event: ProtocolViolation) -> None:
        self.metrics.frames.labels("protocol_error").inc()
        self.metrics.tunnels_closed.labels("protocol").inc()
        log.warning("closing tunnel from %s: %s", self.ws.remote_address, event.error)
        await self._drop(event.code, event.reason, event.reply)

    async def _handle(self, event: WorkerEvent) -> None:
        if isinstance(event, FrameReceived):
            await self._on_frame(event.frame, event.payload)
        elif isinstance(event, StreamOpened):
            self._on_open(event)
        elif isinstance(event, StreamClosed):
            if self._end_session(event.stream_id):
                self.metrics.streams.dec()
            else:
                self._pacer.spend(time.monotonic())
        elif isinstance(event, Refused):
            if event.code == "bad_frame":
                self.metrics.drops.labels("bad_frame").inc()
            self._count_error(event.code)
            self._enqueue(event.reply)

    def _on_open(self, event: StreamOpened) -> None:
        msg = event.open
        if event.reopened:  # a restart of the stream: rare, so paced
            self._pacer.spend(time.monotonic())
        try:
            model = self._model_for(msg)
        except FramerelayError as exc:
            self._refuse_open(event, _MODEL_REFUSALS.get(type(exc), "bad_model"), str(exc))
            return
        try:
            session = self._session_for(msg, event.snapshot)
        except ConfigError as exc:
            if model is not None and self.models is not None:
                self.models.release(model)
            self._refuse_open(event, "bad_tracker", str(exc))
            return
        session.model = model
        if not self._end_session(msg.stream_id):
            self.metrics.streams.inc()
        self.sessions[msg.stream_id] = session

    def _refuse_open(self, event: StreamOpened, code: str, message: str) -> None:
        self._count_error(code)
        self._enqueue(self.proto.refuse_open(event, code, message))

    def _model_for(self, msg: wire.Open) -> ServedModel | None:
        """The stream's model, counted in the pool (None: no pool, the batcher's detector).
        Raises ConfigError (unknown), ModelError or CapacityError."""
        if self.models is None:
            if msg.model_name is not None:
                raise ConfigError(f"this worker serves one model; unknown {msg.model_name!r}")
            return None
        return self.models.acquire(msg.model_name)

    def _end_session(self, stream_id: str) -> bool:
        """Free a stream's session and its hold on its model; False if it had none."""
        session = self.sessions.pop(stream_id, None)
        if session is None:
            return False
        if session.model is not None and self.models is not None:
            self.models.release(session.model)
        return True

    def _session_for(self, msg: wire.Open, snapshot: bytes) -> StreamSession:
        """A fresh session, or one resumed from the snapshot the OPEN carries."""
        args = (self.settings.result_min_confidence, self.settings.snapshot_interval_s)
        if msg.clock is not None and snapshot:
            try:
                session = resumed_session(
                    msg.stream_id, snapshot, msg.clock, *args, times=msg.times
                )
                self.metrics.resumed.inc()
                return session
            except ConfigError as exc:  # a bad snapshot must not cost the stream
                self._reply_error("bad_snapshot", f"starting a new session: {exc}", msg.stream_id)
        return new_session(msg.stream_id, msg.tracker, *args, times=msg.times)

    async def _on_frame(self, frame: wire.Frame, payload: bytes | memoryview) -> None:
        session = self.sessions.get(frame.stream_id)
        if session is None:  # the protocol knows it open, but its session failed to start
            self._reply_error(
                "unknown_stream", "send OPEN before frames", frame.stream_id, frame.seq
            )
            return
        if not self.batcher.has_room(self._lane):  # refuse before paying for the decode
            self._refuse_capacity(frame)
            return
        if self.batcher.decoder is None:
            await self._decoder.start(frame, payload, session)
            return
        now = time.monotonic()  # the batcher's decode stage decodes it with its batch
        item = WorkItem(frame, None, session, self._reply, now, now, self._lane, payload)
        if not self.batcher.submit(item):
            self._refuse_capacity(frame)

    def _decoded(self, job: Decoding, outcome: Image | ProtocolError) -> None:
        """A frame's decode finished (in its stream's order): to the batcher, or refused."""
        frame = job.frame
        if isinstance(outcome, ProtocolError):
            self.metrics.drops.labels("bad_image").inc()
            self._reply_error("bad_image", str(outcome), frame.stream_id, frame.seq)
            return
        if self._done:
            return
        item = WorkItem(
            frame, outcome, job.session, self._reply, job.received_at, job.decoded_at, self._lane
        )
        self.metrics.stage_ms.labels("decode").observe((job.decoded_at - job.received_at) * 1000)
        if not self.batcher.submit(item):
            self._refuse_capacity(frame)

    def _refuse_capacity(self, frame: wire.Frame) -> None:
        self.metrics.drops.labels("capacity").inc()
        self._reply_error("capacity", "worker queue is full", frame.stream_id, frame.seq)

    def _reply(self, item: WorkItem, outcome: Outcome) -> None:
        """The batcher's answer for one frame (on the event loop)."""
        if self._done or self.proto.state is not WorkerState.OPEN:
            return
        if isinstance(outcome, Failure):
            self.metrics.drops.labels(outcome.code).inc()
            self._reply_error(outcome.code, outcome.message, item.frame.stream_id, item.frame.seq)
            return
        self.metrics.frames.labels("ok").inc()
        for header, payload in outcome:
            if isinstance(header, wire.Result):
                self._enqueue(self.proto.send_result(header, payload))
            else:
                self._enqueue(self.proto.send_snapshot(header, payload))

    def _reply_error(
        self, code: str, message: str, stream_id: str | None = None, seq: int | None = None
    ) -> None:
        if self._done or self.proto.state is not WorkerState.OPEN:
            return
        self._count_error(code)
        self._enqueue(self.proto.send_error(code, message, stream_id, seq))

    def _count_error(self, code: str) -> None:
        """Metrics and budgets of one ERROR sent."""
        self.metrics.frames.labels(code).inc()
        if code in REFUSED_CODES:
            now = time.monotonic()
            self._pacer.spend(now)
            if code in BAD_FRAME_CODES and not self._bad.spend(now):
                self._over_budget()

    def _over_budget(self) -> None:
        if self._abort is not None:
            return
        self._abort = f"too many bad frames: more than {self._bad.limit} in 1 s"
        log.warning("closing tunnel from %s: %s", self.ws.remote_address, self._abort)
        self.metrics.tunnels_closed.labels("bad_frames").inc()

    def _enqueue(self, data: bytes) -> None:
        if self._done:
            return
        try:
            self._out.put(data)
        except OutboxFull:
            self.metrics.drops.labels("slow_peer").inc()
            if not self._slow:
                self._slow = True
                log.warning("peer %s is not reading results; closing", self.ws.remote_address)
                self.metrics.tunnels_closed.labels("slow_peer").inc()
                asyncio.get_running_loop().create_task(
                    self.ws.close(wire.CloseCode.TRY_AGAIN_LATER, "not reading results")
                )
        except ConnectionError:  # the writer has stopped: the tunnel is closing
            return

    async def _send_loop(self) -> None:
        try:
            await self._out.run(SEND_TIMEOUT_S)
        except TimeoutError:
            self.metrics.drops.labels("slow_peer").inc()
            await self.ws.close(wire.CloseCode.TRY_AGAIN_LATER, "send timeout: not reading results")
