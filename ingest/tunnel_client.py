"""The ingest end of the tunnel: one WebSocket to a worker, many streams.

Per stream, a sender task waits for a credit, takes the newest prepared frame
and sends it; a single receiver task turns results back into
:class:`ResultRecord` values and returns credits. When the connection drops,
frames in flight are counted as ``disconnected`` and the client reconnects
with capped exponential backoff and jitter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from framerelay import wire
from framerelay.credits import waited_s
from framerelay.errors import AuthError, ConfigError, ProtocolError
from framerelay.results import ResultRecord
from ingest.handoff import SlotClosed
from ingest.stream import IngestStream

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 15.0
SEND_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
DRAIN_POLL_S = 0.05


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
    ) -> None:
        if not url.startswith(("ws://", "wss://")):
            raise ConfigError(f"worker URL must start with ws:// or wss://, got {url!r}")
        if server_hostname is not None and (ssl_context is None or not url.startswith("wss://")):
            raise ConfigError("a TLS server name needs a wss:// worker URL and a TLS context")
        self.url = url
        self._token = token
        self._on_result = on_result
        self._ssl = ssl_context
        self.server_hostname = server_hostname
        """The name the worker's certificate must carry (default: the URL's host)."""
        self.frame_timeout_s = frame_timeout_s
        self.reconnect_max_s = reconnect_max_s
        self.streams: dict[str, IngestStream] = {}
        self.snapshots: dict[str, tuple[wire.SessionClock, bytes]] = {}
        """Latest session snapshot per stream; sent back in OPEN on (re)connect."""
        self.hello: wire.Hello | None = None
        self.connected = asyncio.Event()
        self._wanted = asyncio.Event()
        """Set once a stream was added: no tunnel is opened before there is work."""
        self.connects = 0
        self.last_error: str | None = None
        self._ws: ClientConnection | None = None
        self._senders: set[asyncio.Task[None]] = set()
        self._serving: dict[str, asyncio.Task[Any]] = {}
        """The sender task serving each stream (so one stream can be let go)."""
        self._failed: asyncio.Future[None] | None = None

    def add(
        self, stream: IngestStream, snapshot: tuple[wire.SessionClock, bytes] | None = None
    ) -> None:
        """Add a stream (optionally resuming a session snapshot taken elsewhere);
        it starts flowing as soon as a worker is connected."""
        self.streams[stream.id] = stream
        self._wanted.set()
        if snapshot is not None:
            self.snapshots[stream.id] = snapshot
        if self.hello is not None:
            stream.start(self.hello.input_w, self.hello.input_h)
        if self._ws is not None and self.hello is not None:
            self._spawn(self._serve_stream(self._ws, stream))

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, pump, reconnect; returns when ``stop`` is set."""
        delay = 0.25
        while not stop.is_set():
            if not self._wanted.is_set():
                await _first(self._wanted, stop)
                continue
            started = time.monotonic()
            try:
                await self._connect_once(stop)
            except AuthError as exc:
                self.last_error = str(exc)
                log.error("worker refused the tunnel: %s", exc)
            except (OSError, TimeoutError, ConnectionClosed, ProtocolError, InvalidURI) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("tunnel to %s lost: %s", self.url, self.last_error)
            finally:
                self._on_disconnect()
            if stop.is_set():
                return
            if time.monotonic() - started > 30:  # healthy for a while: reset backoff
                delay = 0.25
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay * random.uniform(0.8, 1.2)):  # noqa: S311
                    await stop.wait()
            delay = min(delay * 2, self.reconnect_max_s)

    async def _connect_once(self, stop: asyncio.Event) -> None:
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
                proxy=None,
                max_queue=64,
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
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            header, _ = wire.decode(await ws.recv(decode=False))
        if not isinstance(header, wire.Hello):
            raise ProtocolError(f"expected HELLO from the worker, got {type(header).__name__}")
        self.hello, self._ws = header, ws
        self.connects += 1
        self.connected.set()
        log.info("tunnel up to worker %s (%s)", header.worker_id, ",".join(header.providers))
        self._failed = asyncio.get_running_loop().create_future()
        for stream in list(self.streams.values()):
            stream.window.cap = min(stream.window.cap, header.max_inflight)
            stream.start(header.input_w, header.input_h)
            self._spawn(self._serve_stream(ws, stream))
        receiver = asyncio.create_task(self._receive(ws), name="tunnel-receive")
        stopping = asyncio.create_task(stop.wait())
        try:
            watched: set[asyncio.Future[Any]] = {receiver, stopping, self._failed}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (receiver, stopping, *self._senders):
                task.cancel()
            await asyncio.gather(receiver, stopping, *self._senders, return_exceptions=True)
            self._senders.clear()
        if self._failed.done():
            raise self._failed.exception() or ConnectionError("sender failed")
        if receiver.done() and not receiver.cancelled() and receiver.exception() is not None:
            raise receiver.exception()  # type: ignore[misc]

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

    def _on_disconnect(self) -> None:
        self._ws = None
        self.connected.clear()
        for stream in self.streams.values():
            lost = stream.window.abandon()
            stream.counters["disconnected"] += lost
            stream.credit.set()

    async def _serve_stream(self, ws: ClientConnection, stream: IngestStream) -> None:
        # Tells the stream when a sender serves it: IngestService.remove_stream/update_stream
        # wait for ``stream.sender_idle`` (last results, CLOSE sent) before forgetting it.
        stream.sender_started()
        task = asyncio.current_task()
        if task is not None:
            self._serving[stream.id] = task
        try:
            await self._stream_task(ws, stream)
        finally:
            if self._serving.get(stream.id) is task:
                del self._serving[stream.id]
            stream.sender_stopped()

    async def detach(
        self, stream_id: str
    ) -> tuple[IngestStream, tuple[wire.SessionClock, bytes] | None] | None:
        """Stop sending ``stream_id`` here without stopping the stream; returns it
        with its latest session snapshot (to resume it on another worker)."""
        stream = self.streams.pop(stream_id, None)
        snapshot = self.snapshots.pop(stream_id, None)
        if stream is None:
            return None
        task = self._serving.pop(stream_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed, TimeoutError, OSError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await ws.send(wire.encode(wire.Close(stream_id=stream_id)))
        stream.counters["disconnected"] += stream.window.abandon()
        stream.credit.set()
        return stream, snapshot

    async def _stream_task(self, ws: ClientConnection, stream: IngestStream) -> None:
        await ws.send(self._open_message(stream))
        while True:
            await self._wait_credit(stream)
            try:
                out = await stream.slot.get()
            except SlotClosed:
                break
            header = wire.Frame(
                stream_id=stream.id,
                epoch=out.epoch,
                seq=out.seq,
                pts=out.pts,
                time_base=(out.time_base.numerator, out.time_base.denominator),
                captured_at=out.captured_at,
                src_w=out.prepared.letterbox.src_w,
                src_h=out.prepared.letterbox.src_h,
                scale=out.prepared.letterbox.scale,
            )
            stream.window.sent(out.seq, time.monotonic())
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await ws.send(wire.encode(header, out.prepared.data))
            stream.counters["sent"] += 1
        await self._drain(stream)
        await ws.send(wire.encode(wire.Close(stream_id=stream.id)))

    def _open_message(self, stream: IngestStream) -> bytes:
        snap = self.snapshots.get(stream.id)
        if snap is None:
            return wire.encode(wire.Open(stream_id=stream.id, tracker=stream.config.tracker))
        clock, blob = snap
        header = wire.Open(stream_id=stream.id, tracker=stream.config.tracker, clock=clock)
        return wire.encode(header, blob)

    async def _wait_credit(self, stream: IngestStream) -> None:
        while not stream.window.can_send():
            stream.credit.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await stream.credit.wait()
            self._expire(stream)

    async def _drain(self, stream: IngestStream) -> None:
        """The source ended: wait (bounded) for the last results."""
        while stream.window.inflight:
            await asyncio.sleep(DRAIN_POLL_S)
            self._expire(stream)

    def _expire(self, stream: IngestStream) -> None:
        late = stream.window.expire(time.monotonic(), self.frame_timeout_s)
        if late:
            stream.counters["timeout"] += len(late)
            log.warning(
                "stream %s: %d frame(s) got no answer in %.0f s",
                stream.id,
                len(late),
                self.frame_timeout_s,
            )

    async def _receive(self, ws: ClientConnection) -> None:
        async for data in ws:
            if isinstance(data, str):
                raise ProtocolError("worker sent a text message")
            header, payload = wire.decode(data)
            if isinstance(header, wire.Result):
                self._on_result_msg(header, payload)
            elif isinstance(header, wire.Error):
                self._on_error_msg(header)
            elif isinstance(header, wire.Snapshot):
                if header.stream_id in self.streams:
                    self.snapshots[header.stream_id] = (header.clock, payload)
            else:
                raise ProtocolError(f"unexpected {type(header).__name__} from the worker")

    def _on_result_msg(self, header: wire.Result, payload: bytes) -> None:
        stream = self.streams.get(header.stream_id)
        if stream is None:
            return
        det = wire.unpack_detections(header.n, payload)
        rtt = stream.window.completed(header.seq, time.monotonic(), waited_s(header.timings))
        if not stream.lossless:
            stream.window.resize(stream.sampling_fps)
        stream.credit.set()
        assert self.hello is not None  # noqa: S101 - results only follow a HELLO
        record = ResultRecord.build(
            header,
            det,
            class_names=self.hello.class_names,
            worker_id=self.hello.worker_id,
            received_at=time.time(),
            extra_timings={"roundtrip_ms": rtt * 1000} if rtt is not None else None,
        )
        stream.counters["results"] += 1
        stream.latency_ms.append(record.latency_ms)
        self._on_result(record)

    def _on_error_msg(self, header: wire.Error) -> None:
        stream = self.streams.get(header.stream_id or "")
        if stream is None or header.seq is None:
            log.warning("worker error %s: %s", header.code, header.message)
            return
        stream.window.completed(header.seq, time.monotonic())
        stream.counters["worker_error"] += 1
        stream.credit.set()
        log.debug(
            "stream %s frame %d: worker said %s: %s",
            stream.id,
            header.seq,
            header.code,
            header.message,
        )


async def _first(*events: asyncio.Event) -> None:
    """Wait until any of ``events`` is set."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
