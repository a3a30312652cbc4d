"""One stream's sending over a tunnel: OPEN, frames as credits allow, drain, CLOSE.

:func:`send_stream` is the body of a stream's sender task in
:class:`ingest.tunnel_client.TunnelClient`. It raises :data:`TUNNEL_ERRORS`
when the connection fails (the tunnel's business) and anything else when the
stream itself is at fault (e.g. a frame the wire refuses): the client fails
that stream alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from framerelay import wire
from ingest.handoff import SlotClosed
from ingest.stream import IngestStream

log = logging.getLogger(__name__)
SEND_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
DRAIN_POLL_S = 0.05
TUNNEL_ERRORS = (ConnectionClosed, OSError, TimeoutError)
"""Failures of the connection itself: they end the session, never a stream."""


async def send_stream(
    ws: ClientConnection, stream: IngestStream, open_message: bytes, frame_timeout_s: float
) -> None:
    """OPEN, then every frame the stream offers while credits allow, then CLOSE."""
    await ws.send(open_message)
    while True:
        await _wait_credit(stream, frame_timeout_s)
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
        message = wire.encode(header, out.prepared.data)
        stream.window.sent(out.seq, time.monotonic())
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await ws.send(message)
        stream.counters["sent"] += 1
    await _drain(stream, frame_timeout_s)
    await ws.send(wire.encode(wire.Close(stream_id=stream.id)))


async def send_close(ws: ClientConnection, stream_id: str) -> None:
    """CLOSE ``stream_id`` on the worker, if the connection takes it in time."""
    with contextlib.suppress(*TUNNEL_ERRORS):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await ws.send(wire.encode(wire.Close(stream_id=stream_id)))


def open_message(stream: IngestStream, snap: tuple[wire.SessionClock, bytes] | None) -> bytes:
    """OPEN for ``stream``, resuming the session snapshot ``snap`` when there is one."""
    if snap is None:
        return wire.encode(wire.Open(stream_id=stream.id, tracker=stream.config.tracker))
    clock, blob = snap
    header = wire.Open(stream_id=stream.id, tracker=stream.config.tracker, clock=clock)
    return wire.encode(header, blob)


async def _wait_credit(stream: IngestStream, frame_timeout_s: float) -> None:
    while not stream.window.can_send():
        stream.credit.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stream.credit.wait()
        _expire(stream, frame_timeout_s)


async def _drain(stream: IngestStream, frame_timeout_s: float) -> None:
    """The source ended: wait (bounded) for the last results."""
    while stream.window.inflight:
        await asyncio.sleep(DRAIN_POLL_S)
        _expire(stream, frame_timeout_s)


def _expire(stream: IngestStream, frame_timeout_s: float) -> None:
    late = stream.window.expire(time.monotonic(), frame_timeout_s)
    if late:
        stream.counters["timeout"] += len(late)
        log.warning(
            "stream %s: %d frame(s) got no answer in %.0f s", stream.id, len(late), frame_timeout_s
        )
