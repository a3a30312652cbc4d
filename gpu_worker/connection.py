"""One authenticated tunnel: many streams multiplexed on one WebSocket.

The receive loop validates every message; a malformed one closes only this
connection (with the protocol error as the close reason). Per-frame problems
(undecodable image, unknown stream, full queue) are answered with an ERROR for
that frame, which returns the sender's credit. Results leave through a bounded
outbound queue with a send timeout, so a peer that stops reading is cut off
instead of stalling the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Executor

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from framerelay import wire
from framerelay.errors import ConfigError, ProtocolError
from gpu_worker.batcher import Batcher, WorkItem
from gpu_worker.images import decode_jpeg_bgr
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.sessions import StreamSession, new_session, resumed_session
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)
SEND_TIMEOUT_S = 10.0


class TunnelConnection:
    def __init__(
        self,
        ws: ServerConnection,
        settings: WorkerSettings,
        batcher: Batcher,
        metrics: WorkerMetrics,
        decode_pool: Executor,
        hello: wire.Hello,
    ) -> None:
        self.ws = ws
        self.settings = settings
        self.batcher = batcher
        self.metrics = metrics
        self.decode_pool = decode_pool
        self.hello = hello
        self.limits = wire.Limits(max_payload=settings.max_message_bytes)
        self.sessions: dict[str, StreamSession] = {}
        bound = settings.max_streams_per_connection * settings.max_inflight + 64
        self._out: asyncio.Queue[bytes] = asyncio.Queue(maxsize=bound)
        self._done = False

    async def run(self) -> None:
        self.metrics.connections.inc()
        try:
            await self.ws.send(wire.encode(self.hello))
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
            self.metrics.connections.dec()
            self.metrics.streams.dec(len(self.sessions))
            self.sessions.clear()

    async def _receive_loop(self) -> None:
        async for data in self.ws:
            if isinstance(data, str):
                await self._fail(
                    ProtocolError("text messages are not part of the protocol", close_code=1003)
                )
                return
            try:
                header, payload = wire.decode(data, self.limits)
                await self._dispatch(header, payload)
            except ProtocolError as exc:
                self.metrics.frames.labels("protocol_error").inc()
                await self._fail(exc)
                return

    async def _fail(self, exc: ProtocolError) -> None:
        log.warning("closing tunnel from %s: %s", self.ws.remote_address, exc)
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            async with asyncio.timeout(2):
                await self.ws.send(
                    wire.encode(wire.Error(code="protocol", message=str(exc)[:2000]))
                )
        await self.ws.close(exc.close_code, str(exc)[:120])

    async def _dispatch(self, header: wire.Header, payload: bytes) -> None:
        if isinstance(header, wire.Frame):
            await self._on_frame(header, payload)
        elif isinstance(header, wire.Open):
            self._on_open(header, payload)
        elif isinstance(header, wire.Close):
            if self.sessions.pop(header.stream_id, None) is not None:
                self.metrics.streams.dec()
        else:
            raise ProtocolError(f"{type(header).__name__} is not accepted from an ingest")

    def _on_open(self, msg: wire.Open, snapshot: bytes) -> None:
        limit = self.settings.max_streams_per_connection
        if msg.stream_id not in self.sessions and len(self.sessions) >= limit:
            self._reply_error(
                "too_many_streams", f"limit is {limit} streams per tunnel", msg.stream_id
            )
            return
        try:
            session = self._session_for(msg, snapshot)
        except ConfigError as exc:
            self._reply_error("bad_tracker", str(exc), msg.stream_id)
            return
        if self.sessions.get(msg.stream_id) is None:
            self.metrics.streams.inc()
        self.sessions[msg.stream_id] = session

    def _session_for(self, msg: wire.Open, snapshot: bytes) -> StreamSession:
        """A fresh session, or one resumed from the snapshot the OPEN carries."""
        args = (self.settings.result_min_confidence, self.settings.snapshot_interval_s)
        if msg.clock is not None and snapshot:
            try:
                session = resumed_session(msg.stream_id, snapshot, msg.clock, *args)
                self.metrics.resumed.inc()
                return session
            except ConfigError as exc:  # a bad snapshot must not cost the stream
                self._reply_error("bad_snapshot", f"starting a new session: {exc}", msg.stream_id)
        return new_session(msg.stream_id, msg.tracker, *args)

    async def _on_frame(self, frame: wire.Frame, payload: bytes) -> None:
        received = time.monotonic()
        session = self.sessions.get(frame.stream_id)
        if session is None:
            self._reply_error(
                "unknown_stream", "send OPEN before frames", frame.stream_id, frame.seq
            )
            return
        if session.inflight >= self.settings.max_inflight:
            self._reply_error(
                "credit_exceeded",
                f"at most {self.settings.max_inflight} frames in flight per stream",
                frame.stream_id,
                frame.seq,
            )
            return
        w, h = self.hello.input_w, self.hello.input_h
        loop = asyncio.get_running_loop()
        try:
            image = await loop.run_in_executor(self.decode_pool, decode_jpeg_bgr, payload, w, h)
        except ProtocolError as exc:
            self.metrics.drops.labels("bad_image").inc()
            self._reply_error("bad_image", str(exc), frame.stream_id, frame.seq)
            return
        item = WorkItem(frame, image, session, self._reply_result, received, time.monotonic())
        self.metrics.stage_ms.labels("decode").observe((item.decoded_at - received) * 1000)
        if not self.batcher.submit(item):
            self.metrics.drops.labels("capacity").inc()
            self._reply_error("capacity", "worker queue is full", frame.stream_id, frame.seq)
            return
        session.inflight += 1

    def _reply_result(self, messages: list[bytes], session: StreamSession) -> None:
        session.inflight = max(0, session.inflight - 1)
        self.metrics.frames.labels("ok").inc()
        for data in messages:
            self._enqueue(data)

    def _reply_error(
        self, code: str, message: str, stream_id: str | None = None, seq: int | None = None
    ) -> None:
        self.metrics.frames.labels(code).inc()
        self._enqueue(
            wire.encode(wire.Error(code=code, message=message[:2000], stream_id=stream_id, seq=seq))
        )

    def _enqueue(self, data: bytes) -> None:
        if self._done:
            return
        try:
            self._out.put_nowait(data)
        except asyncio.QueueFull:
            log.warning("peer %s is not reading results; closing", self.ws.remote_address)
            self.metrics.drops.labels("slow_peer").inc()
            asyncio.get_running_loop().create_task(self.ws.close(1013, "not reading results"))

    async def _send_loop(self) -> None:
        while True:
            data = await self._out.get()
            try:
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    await self.ws.send(data)
            except TimeoutError:
                self.metrics.drops.labels("slow_peer").inc()
                await self.ws.close(1013, "send timeout: not reading results")
                return
