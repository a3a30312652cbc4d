"""A bare tunnel client for worker tests: OPEN, FRAME, and what comes back.

:class:`Tunnel` is an asyncio client on a real socket that records every
RESULT and ERROR per stream and the close code. :class:`RawFlooder` is a
child process that writes pre-built WebSocket frames straight to a socket
(masked with a zero key, so building them costs nothing), reconnecting
whenever the worker closes it: a flood that costs the test almost nothing, so
what it costs the worker shows.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import numpy as np
import simplejpeg
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from framerelay import wire
from framerelay.protocol.negotiation import offer

SIDE = 416
JPEG: bytes = simplejpeg.encode_jpeg(
    np.full((SIDE, SIDE, 3), 114, np.uint8), quality=80, colorspace="BGR", colorsubsampling="420"
)
"""A model-input image (416 x 416 grey) the sample model accepts."""
BLACK_JPEG: bytes = simplejpeg.encode_jpeg(
    np.zeros((SIDE, SIDE, 3), np.uint8), quality=80, colorspace="BGR", colorsubsampling="420"
)


def frame(stream_id: str, seq: int, epoch: int = 0, **update: object) -> wire.Frame:
    f = wire.Frame(
        stream_id=stream_id, epoch=epoch, seq=seq, pts=seq * 3600, time_base=(1, 90_000),
        captured_at=time.time(), src_w=SIDE, src_h=SIDE, scale=1.0,
    )  # fmt: skip
    return msgspec.structs.replace(f, **update) if update else f


def raw_frame(stream_id: str, seq: int, **fields: str) -> bytes:
    """A FRAME whose header JSON has ``fields`` replaced by raw tokens (``NaN``, ``1e400``)."""
    head = msgspec.json.encode(frame(stream_id, seq)).decode()
    for name, token in fields.items():
        start = head.index(f'"{name}":') + len(name) + 3
        end = min(i for i in (head.find(",", start), head.find("}", start)) if i >= 0)
        head = head[:start] + token + head[end:]
    data = head.encode()
    return struct.pack(">BBI", wire.VERSION, wire.MsgType.FRAME, len(data)) + data + JPEG


@dataclass
class Stream:
    sent: dict[int, float] = field(default_factory=dict)  # seq -> monotonic send time
    rtt_ms: list[float] = field(default_factory=list)
    results: list[wire.Result] = field(default_factory=list)
    errors: list[wire.Error] = field(default_factory=list)
    snapshots: int = 0

    @property
    def inflight(self) -> int:
        return len(self.sent)


class Tunnel:
    """One tunnel (see :func:`open_tunnel`); records what comes back, per stream."""

    def __init__(self, ws: ClientConnection, hello: wire.Hello) -> None:
        self.ws = ws
        self.hello = hello
        self.streams: dict[str, Stream] = {}
        self.other_errors: list[wire.Error] = []
        self.close_code: int | None = None
        self.close_reason = ""
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.ws.close()

    async def open_stream(self, stream_id: str) -> Stream:
        self.streams[stream_id] = Stream()
        await self.ws.send(wire.encode(wire.Open(stream_id=stream_id)))
        return self.streams[stream_id]

    async def send_frame(self, f: wire.Frame, payload: bytes = JPEG) -> None:
        self.streams[f.stream_id].sent[f.seq] = time.monotonic()
        await self.ws.send(wire.encode(f, payload))

    async def send_raw(self, stream_id: str, seq: int, data: bytes) -> None:
        self.streams[stream_id].sent[seq] = time.monotonic()
        await self.ws.send(data)

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                assert isinstance(data, bytes)
                header, _ = wire.decode(data)
                self._on(header)
        except ConnectionClosed:
            pass
        finally:
            if self.ws.close_code is not None:
                self.close_code = self.ws.close_code
                self.close_reason = self.ws.close_reason or ""
            self.closed.set()

    def _on(self, header: wire.Header) -> None:
        stream = self.streams.get(getattr(header, "stream_id", None) or "")
        if stream is None:
            if isinstance(header, wire.Error):
                self.other_errors.append(header)
            return
        if isinstance(header, wire.Snapshot):
            stream.snapshots += 1
            return
        seq = getattr(header, "seq", None)
        sent = stream.sent.pop(seq, None) if seq is not None else None
        if isinstance(header, wire.Result):
            stream.results.append(header)
            if sent is not None:
                stream.rtt_ms.append((time.monotonic() - sent) * 1000)
        elif isinstance(header, wire.Error):
            stream.errors.append(header)


@contextlib.asynccontextmanager
async def open_tunnel(url: str, token: str) -> AsyncIterator[Tunnel]:
    """A tunnel past its HELLO, reading in the background; closed on exit."""
    ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       compression=None, proxy=None, max_size=None,
                       subprotocols=offer())  # fmt: skip
    hello, _ = wire.decode(await ws.recv(decode=False))
    assert isinstance(hello, wire.Hello)
    tunnel = Tunnel(ws, hello)
    try:
        yield tunnel
    finally:
        await tunnel.aclose()


async def pace(
    tunnel: Tunnel, stream_id: str, fps: float, duration_s: float, first_seq: int = 0
) -> int:
    """Send one frame every 1/fps s while the stream has credit; returns the next seq."""
    stream, seq = tunnel.streams[stream_id], first_seq
    period, next_at = 1.0 / fps, time.monotonic()
    end = next_at + duration_s
    while time.monotonic() < end and not tunnel.closed.is_set():
        if stream.inflight < tunnel.hello.max_inflight:
            await tunnel.send_frame(frame(stream_id, seq))
            seq += 1
        next_at += period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return seq


async def settle(tunnel: Tunnel, stream_ids: list[str], timeout_s: float) -> None:
    """Until every frame sent on ``stream_ids`` was answered."""
    deadline = time.monotonic() + timeout_s
    while any(tunnel.streams[s].inflight for s in stream_ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"frames still unanswered after {timeout_s} s")
        await asyncio.sleep(0.02)


async def http_get(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(url, headers=headers)


def metric(text: str, name: str) -> float:
    """The value of one sample line of Prometheus text (0.0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# -- raw flooding ---------------------------------------------------------------


def ws_frame(payload: bytes) -> bytes:
    """One client-to-server binary WebSocket frame (masked with a zero key)."""
    n = len(payload)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x82, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack(">Q", n)
    return head + b"\0\0\0\0" + payload


_CLOSE_FRAME = re.compile(rb"\x88[\x02-\x7d]\x03[\xe8-\xf3]")
"""A server CLOSE frame (unmasked, code 1000-1011) in the byte stream."""


class RawFlooder:
    """A child process writing ``blob`` to a tunnel in a loop while ``on`` is set,
    reconnecting whenever the worker closes it (or refuses it: then every 50 ms).
    Its own process: its CPU and GIL are not the test's. ``source`` is the local
    address it connects from (any 127.x.y.z is loopback): the worker counts
    misbehaving tunnels per address."""

    def __init__(
        self, host: str, port: int, token: str, blob: bytes, source: str = "127.0.0.1"
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.on, self._stop = ctx.Event(), ctx.Event()
        self._counts = ctx.Array("d", 3)  # connects, refused, bytes sent
        args = ((host, port), source, token, blob, self.on, self._stop, self._counts)
        self.proc = ctx.Process(target=_flood, args=args, daemon=True, name="flooder")

    def __enter__(self) -> RawFlooder:
        self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.on.set()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)

    @property
    def counts(self) -> dict[str, float]:
        connects, refused, sent = self._counts[:]
        return {"connects": connects, "refused": refused, "mb_sent": sent / 1e6}


def _flood(
    addr: tuple[str, int],
    source: str,
    token: str,
    blob: bytes,
    on: Any,
    stop: Any,
    counts: Any,
) -> None:
    while not stop.is_set():
        on.wait()
        try:
            with socket.create_connection(addr, timeout=5, source_address=(source, 0)) as sock:
                ok = _handshake(sock, addr, token)
                counts[0 if ok else 1] += 1
                if not ok:
                    time.sleep(0.05)
                    continue
                sock.settimeout(None)
                threading.Thread(target=_drain, args=(sock,), daemon=True).start()
                threading.Thread(target=_switch, args=(sock, on, stop), daemon=True).start()
                while on.is_set() and not stop.is_set():
                    sock.sendall(blob)
                    counts[2] += len(blob)
        except OSError:  # closed by the worker, or switched off
            time.sleep(0.001)


def _switch(sock: socket.socket, on: Any, stop: Any) -> None:
    """Cut the connection when the flood is switched off (a blocked send ends too)."""
    while on.is_set() and not stop.is_set() and sock.fileno() >= 0:
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _handshake(sock: socket.socket, addr: tuple[str, int], token: str) -> bool:
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/tunnel HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: {', '.join(offer())}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            return False
        head += chunk
    return head.startswith(b"HTTP/1.1 101")


def _drain(sock: socket.socket) -> None:
    """Drop what the worker sends; on its CLOSE frame, drop the socket at once (a
    flooder does not wait for the closing handshake: it reconnects)."""
    tail = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(1 << 20):
            if _CLOSE_FRAME.search(tail + chunk):
                sock.shutdown(socket.SHUT_RDWR)
                return
            tail = chunk[-3:]
