"""The ingest end of the tunnel: one WebSocket to a worker, many streams.

Per stream, a sender task waits for a credit, takes the newest prepared frame
and sends it; a single receiver task turns results back into
:class:`ResultRecord` values and returns credits. When the connection drops,
frames in flight are counted as ``disconnected`` and the client reconnects
with capped exponential backoff and jitter.

**Isolation.** An exception in one stream's sender or result handling fails
that stream only (``FAILED`` with the exception in ``error``; a CLOSE frees
its session on the worker); the tunnel and the other streams go on. Only
errors of the connection itself (:data:`TUNNEL_ERRORS`) end a session, and
``run`` never ends on an unexpected exception: it logs it (with its
traceback, once per distinct error), counts it (``errors``) and reconnects.
:func:`supervise` restarts ``run`` should it end anyway.

**Heartbeat.** Beside each session, :class:`ingest.heartbeat.TunnelMonitor`
pings the worker every ``heartbeat_interval_s`` and judges the tunnel
(:mod:`ingest.tunnel_health`): ``state`` is ``STALLED`` and every stream on it
``stall()``-ed when the worker stops answering; back to ``UP`` when pongs or
results resume. A tunnel stalled for another threshold is closed (frames in
flight count ``disconnected``, no closing handshake) and connected again.
``on_state(client)`` hears every state change and stall (the worker pool
fails streams over on it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from framerelay import wire
from framerelay.backoff import Backoff
from framerelay.errors import AuthError, ProtocolError
from framerelay.outbox import CoalescingClientConnection, Outbox
from framerelay.protocol import (
    FrameFailed,
    HelloReceived,
    IngestEvent,
    IngestProtocol,
    NoCommonVersion,
    PeerError,
    ProtocolViolation,
    ResultReceived,
    SessionSnapshot,
)
from framerelay.protocol import negotiation as versions
from framerelay.results import ResultRecord
from ingest import tunnel_answers as answers
from ingest import tunnel_hints
from ingest.heartbeat import TunnelMonitor, TunnelStalled
from ingest.stream import IngestStream, StreamState
from ingest.tunnel_answers import MAX_REASON
from ingest.tunnel_health import TunnelHealth, TunnelState
from ingest.tunnel_sender import (
    CLOSE_TIMEOUT_S,
    OUTBOX_CAPACITY,
    SEND_TIMEOUT_S,
    TUNNEL_ERRORS,
    send_close,
    send_stream,
)
from ingest.tunnel_supervision import first_of, sleep_unless, supervise

__all__ = ["TunnelClient", "client_ssl_context", "supervise"]
log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 15.0
HEALTHY_AFTER_S = 30.0
"""A session that lasted this long resets the reconnect backoff."""


def client_ssl_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


class TunnelClient:
    def __init__(
        self,
        url: str,
        token: Callable[[], str],
        on_result: Callable[[ResultRecord], None],
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        frame_timeout_s: float = 10.0,
        reconnect_max_s: float = 10.0,
        heartbeat_interval_s: float = 0.5,
        stall_after_s: float = 3.0,
        on_state: Callable[[TunnelClient], None] | None = None,
    ) -> None:
        tunnel_hints.check_url(url, ssl_context, server_hostname)
        self.url = url
        self._token = token
        self._on_result = on_result
        self._ssl = ssl_context
        self.server_hostname = server_hostname
        """The name the worker's certificate must carry (default: the URL's host)."""
        self.frame_timeout_s = frame_timeout_s
        self.reconnect_max_s = reconnect_max_s
        self.streams: dict[str, IngestStream] = {}
        self.monitor = TunnelMonitor(
            url, self.streams, interval_s=heartbeat_interval_s, stall_after_s=stall_after_s,
            on_change=lambda: on_state(self) if on_state is not None else None,
        )  # fmt: skip
        self.snapshots: dict[str, SessionSnapshot] = {}
        """Latest session snapshot per stream (every session's protocol caches into it);
        sent back in OPEN on (re)connect."""
        self.hello: wire.Hello | None = None
        self.connected = asyncio.Event()
        self._wanted = asyncio.Event()
        """Set once a stream was added: no tunnel is opened before there is work."""
        self.connects = 0
        self.errors = 0
        """Unexpected exceptions that ended a session (each logged, then reconnected)."""
        self.task_errors = 0
        """Streams failed by an exception in their sender or result handling."""
        self.restarts = 0
        """Times :func:`supervise` had to start ``run`` again."""
        self.last_error: str | None = None
        self._outbox: Outbox | None = None
        """The current session's writer (None between sessions)."""
        self._proto: IngestProtocol | None = None
        """The conversation of the current session (None between sessions)."""
        self._senders: set[asyncio.Task[None]] = set()
        self._serving: dict[str, asyncio.Task[Any]] = {}
        """The sender task serving each stream (so one stream can be let go)."""
        self._failed: asyncio.Future[None] | None = None
        self._error_seen: str | None = None
        self._failing: dict[str, int] = {}
        """Worker errors in a row per stream."""

    def add(self, stream: IngestStream, snapshot: SessionSnapshot | None = None) -> None:
        """Add a stream (optionally resuming a session snapshot taken elsewhere);
        it starts flowing as soon as a worker is connected."""
        self.streams[stream.id] = stream
        self._wanted.set()
        if snapshot is not None:
            self.snapshots[stream.id] = snapshot
        self.monitor.added(stream)
        if self.hello is not None:
            stream.start(self.hello.input_w, self.hello.input_h)
        if self._outbox is not None and self._proto is not None and self.hello is not None:
            self._start_stream(self._outbox, self._proto, stream)

    @property
    def worker_id(self) -> str | None:
        return self.hello.worker_id if self.hello is not None else None

    @property
    def state(self) -> TunnelState:
        """IDLE, CONNECTING, UP, STALLED or DOWN (see :mod:`ingest.tunnel_health`)."""
        return self.monitor.state

    @property
    def health(self) -> TunnelHealth:
        return self.monitor.health

    @property
    def stall_reason(self) -> str | None:
        return self.monitor.stall_reason

    @property
    def unhealthy(self) -> bool:
        """Stalled now, or not up again since a stall or a lost connection."""
        return self.monitor.unhealthy

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, pump, reconnect; returns when ``stop`` is set (never on an error)."""
        backoff = Backoff(min(0.25, self.reconnect_max_s), self.reconnect_max_s)
        rng = random.Random()  # noqa: S311 - jitter, not security
        try:
            while not stop.is_set():
                if not self._wanted.is_set():
                    await first_of(self._wanted, stop)
                    continue
                started = time.monotonic()
                await self._attempt(stop)
                if stop.is_set():
                    return
                if time.monotonic() - started > HEALTHY_AFTER_S:
                    backoff.reset()
                await sleep_unless(stop, backoff.next_delay(rng))
        finally:
            self.monitor.stop()

    async def _attempt(self, stop: asyncio.Event) -> None:
        """One connection, from connect to its end; every failure is logged, none raised."""
        try:
            await self._connect_once(stop)
        except AuthError as exc:
            self.last_error = str(exc)
            log.error("worker refused the tunnel: %s", exc)
        except (*TUNNEL_ERRORS, ProtocolError, TunnelStalled, InvalidHandshake, InvalidURI) as exc:
            self.last_error = tunnel_hints.describe(self.url, exc)  # what to change, if known
            log.warning("tunnel to %s lost: %s", self.url, self.last_error)
            if isinstance(exc, NoCommonVersion) or tunnel_hints.misconfigured(exc):
                # no use waiting: say so on every stream
                for stream in self.streams.values():
                    stream.last_error = self.last_error
        except Exception as exc:  # a bug or an unforeseen library error: reconnect anyway
            self._unexpected(exc)
        finally:
            self._on_disconnect(stopping=stop.is_set())

    def _unexpected(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {_short(exc)}"
        if self.last_error != self._error_seen:  # the traceback once per distinct error
            self._error_seen = self.last_error
            log.error("tunnel to %s: unexpected error; reconnecting", self.url, exc_info=exc)
        else:
            log.warning("tunnel to %s lost again: %s", self.url, self.last_error)

    async def _connect_once(self, stop: asyncio.Event) -> None:
        self.monitor.set_state(TunnelState.CONNECTING)
        headers = {"Authorization": f"Bearer {self._token()}"}
        tls: dict[str, Any] = {"ssl": self._ssl}
        if self.server_hostname is not None:
            tls["server_hostname"] = self.server_hostname
        try:
            ws = await connect(
                self.url,
                additional_headers=headers,
                **tls,
                compression=None,
                max_size=wire.DEFAULT_LIMITS.max_message,
                open_timeout=HELLO_TIMEOUT_S,
                subprotocols=versions.offer(),
                close_timeout=CLOSE_TIMEOUT_S,
                proxy=None,
                max_queue=64,
                create_connection=CoalescingClientConnection,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            reason = exc.response.body.decode(errors="replace").strip()[:300]
            if status in (401, 403):
                raise AuthError(f"HTTP {status}: {reason}") from None
            raise ProtocolError(f"worker answered HTTP {status}: {reason}") from None
        async with ws:
            await self._session(ws, stop)

    async def _session(self, ws: ClientConnection, stop: asyncio.Event) -> None:
        proto, header = await self._handshake(ws)
        outbox = Outbox(ws, OUTBOX_CAPACITY)
        writer = asyncio.create_task(outbox.run(SEND_TIMEOUT_S), name="tunnel-send")
        self._up(ws, outbox, proto, header)
        self._failed = asyncio.get_running_loop().create_future()
        for stream in list(self.streams.values()):
            stream.start(header.input_w, header.input_h)
            self._start_stream(outbox, proto, stream)
        receiver = asyncio.create_task(self._receive(ws, proto), name="tunnel-receive")
        watcher = asyncio.create_task(self.monitor.watch(), name="tunnel-heartbeat")
        stopping = asyncio.create_task(stop.wait())
        try:
            watched: set[asyncio.Future[Any]] = {receiver, watcher, writer, stopping, self._failed}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self.state is TunnelState.STALLED:  # a frozen peer: no closing handshake
                ws.transport.abort()
            elif stop.is_set():  # a graceful stop: the CLOSEs already put go out first
                await outbox.flush(CLOSE_TIMEOUT_S)
            tasks = (receiver, watcher, writer, stopping, *self._senders)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._senders.clear()
        for task in (watcher, receiver, writer):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if self._failed.done():
            raise self._failed.exception() or ConnectionError("sender failed")

    async def _handshake(self, ws: ClientConnection) -> tuple[IngestProtocol, wire.Hello]:
        """The version the worker chose, then its HELLO: the session's protocol, OPEN."""
        try:
            version = versions.accepted(ws.subprotocol)
        except ProtocolError as exc:
            await ws.close(exc.close_code, str(exc))
            raise
        proto = IngestProtocol(version, snapshots=self.snapshots)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                data = await ws.recv(decode=False)
        except ConnectionClosed as exc:
            if exc.rcvd is None or exc.rcvd.code != wire.CloseCode.PROTOCOL:
                raise
            refused = f"the worker refused the tunnel: {exc.rcvd.reason}"
            if exc.rcvd.reason.startswith("no common tunnel version"):
                raise NoCommonVersion(refused) from None
            raise ProtocolError(refused) from None
        for event in proto.receive_data(data, time.monotonic()):
            if isinstance(event, ProtocolViolation):
                await ws.close(event.code, event.reason)
                raise event.error
            if isinstance(event, HelloReceived):
                return proto, event.hello
        raise ProtocolError("no HELLO from the worker")  # unreachable: HELLO or a violation

    def _up(
        self, ws: ClientConnection, outbox: Outbox, proto: IngestProtocol, hello: wire.Hello
    ) -> None:
        self.hello, self._outbox, self._proto = hello, outbox, proto
        self.connects += 1
        self.connected.set()
        log.info("tunnel up to worker %s (%s)", hello.worker_id, ",".join(hello.providers))
        self.monitor.up(ws, hello.worker_id)

    def _start_stream(self, outbox: Outbox, proto: IngestProtocol, stream: IngestStream) -> None:
        if stream.state is not StreamState.FAILED:  # a failed stream has nothing to send
            self._spawn(self._serve_stream(outbox, proto, stream))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._senders.add(task)
        task.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        self._senders.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(task.exception())  # type: ignore[arg-type]

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for stopped streams to get their last results."""
        if self._senders:
            await asyncio.wait(set(self._senders), timeout=timeout_s)

    def _on_disconnect(self, *, stopping: bool) -> None:
        lost = self._proto.connection_lost() if self._proto is not None else {}
        self._outbox = self._proto = None
        self.connected.clear()
        for stream in self.streams.values():
            stream.counters["disconnected"] += lost.get(stream.id, 0)
            stream.credit.set()
        self.monitor.down(stopping=stopping, last_error=self.last_error)

    async def _serve_stream(
        self, outbox: Outbox, proto: IngestProtocol, stream: IngestStream
    ) -> None:
        # Tells the stream when a sender serves it: IngestService.remove_stream/update_stream
        # wait for ``stream.sender_idle`` (last results, CLOSE sent) before forgetting it.
        stream.sender_started()
        task = asyncio.current_task()
        if task is not None:
            self._serving[stream.id] = task
        try:
            await send_stream(outbox, proto, stream, self.frame_timeout_s)
        except TUNNEL_ERRORS:
            raise
        except Exception as exc:  # this stream's bug (e.g. a frame the wire refuses)
            self._stream_crashed(stream, "sender", exc)
            send_close(outbox, proto, stream.id)
        finally:
            if self._serving.get(stream.id) is task:
                del self._serving[stream.id]
            stream.sender_stopped()

    def _stream_crashed(self, stream: IngestStream, where: str, exc: Exception) -> None:
        """Fail ``stream`` alone: FAILED with the exception, its frames in flight given up."""
        self.task_errors += 1
        if self._proto is not None:  # its late answers are dropped from now on
            self._proto.forget(stream.id)
        trace = stream.spec.scrub("".join(traceback.format_exception(exc)))
        log.error("stream %s: %s crashed; failing this stream only:\n%s", stream.id, where, trace)
        stream.fail(f"{where} crashed: {type(exc).__name__}: {_short(exc)}")
        stream.counters["disconnected"] += stream.window.abandon()
        stream.credit.set()

    async def detach(
        self, stream_id: str, *, close: bool = True
    ) -> tuple[IngestStream, SessionSnapshot | None] | None:
        """Stop sending ``stream_id`` here without stopping the stream; returns it
        with its latest session snapshot (to resume it on another worker).
        ``close``: send CLOSE so the worker frees the session (skip it for a stalled
        worker: the tunnel is closed anyway)."""
        stream = self.streams.pop(stream_id, None)
        snapshot = self.snapshots.pop(stream_id, None)
        self._failing.pop(stream_id, None)
        if stream is None:
            return None
        task = self._serving.pop(stream_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        outbox, proto = self._outbox, self._proto
        if outbox is not None and proto is not None and close:
            send_close(outbox, proto, stream_id)
        elif proto is not None:
            proto.forget(stream_id)
        stream.counters["disconnected"] += stream.window.abandon()
        stream.credit.set()
        return stream, snapshot

    def describe(self) -> dict[str, object]:
        """State and health, for the API (``GET /v1/workers``) and metrics."""
        return {
            "url": self.url,
            "worker_id": self.worker_id,
            "streams": sorted(self.streams),
            **self.monitor.describe(),
            "connects": self.connects,
            "errors": self.errors,
            "task_errors": self.task_errors,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }

    # -- receiving -------------------------------------------------------------

    async def _receive(self, ws: ClientConnection, proto: IngestProtocol) -> None:
        async for data in ws:
            for event in proto.receive_data(data, time.monotonic()):
                if isinstance(event, ProtocolViolation):
                    await ws.close(event.code, event.reason)
                    raise event.error
                self._on_event(event)

    def _on_event(self, event: IngestEvent) -> None:
        """Act on one event; this stream's bug here fails this stream only."""
        try:
            if isinstance(event, ResultReceived):
                self._on_result_msg(event)
            elif isinstance(event, FrameFailed):
                self._on_error_msg(event)
            elif isinstance(event, PeerError):
                log.warning("worker error %s: %s", event.error.code, event.error.message)
                stream = self.streams.get(event.stream_id or "")
                if stream is not None and event.refuses_open:
                    answers.open_refused(stream, event.error)
        except Exception as exc:
            sid = getattr(event, "stream_id", None)
            stream = self.streams.get(sid) if isinstance(sid, str) else None
            if stream is None:
                raise
            self._stream_crashed(stream, "result handling", exc)

    def _on_result_msg(self, event: ResultReceived) -> None:
        header, rtt = event.result, event.rtt_s
        stream = self.streams.get(header.stream_id)
        if stream is None:
            return
        if not stream.lossless:
            stream.window.resize(stream.sampling_fps)
        stream.credit.set()
        self.monitor.answered(stream, time.monotonic(), rtt)
        answers.answered(stream, self._failing)
        assert self.hello is not None  # noqa: S101 - results only follow a HELLO
        record = ResultRecord.build(
            header,
            event.detections,
            class_names=self.hello.class_names_of(header.model_name),
            worker_id=self.hello.worker_id,
            received_at=time.time(),
            extra_timings={"roundtrip_ms": rtt * 1000} if rtt is not None else None,
        )
        stream.counters["results"] += 1
        stream.latency.observe(record)
        self._on_result(record)

    def _on_error_msg(self, event: FrameFailed) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:
            log.warning("worker error %s: %s", event.code, event.message)
            return
        answers.frame_failed(stream, event, self._failing)
        self.monitor.answered(stream, time.monotonic(), None)


def _short(exc: BaseException) -> str:
    """An exception's message on one line, bounded (pydantic's run over many lines)."""
    return " ".join(str(exc).split())[:MAX_REASON]
