"""One stream's sending over a tunnel: OPEN, frames as credits allow, drain, CLOSE.

:func:`send_stream` is the body of a stream's sender task in
:class:`ingest.tunnel_client.TunnelClient`; the bytes come from the tunnel's
:class:`~framerelay.protocol.IngestProtocol`, which keeps the rules (OPEN
before FRAME, a credit per frame). It raises :data:`TUNNEL_ERRORS` when the
connection fails or its protocol closed (the tunnel's business) and anything
else when the stream itself is at fault (e.g. a frame the wire refuses): the
client fails that stream alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from websockets.exceptions import ConnectionClosed

from framerelay import wire
from framerelay.outbox import Outbox
from framerelay.protocol import IngestProtocol, IngestState
from ingest.console_frames import SentFrame
from ingest.handoff import SlotClosed
from ingest.stream import IngestStream, Outgoing

log = logging.getLogger(__name__)
SEND_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
OUTBOX_CAPACITY = 4096
"""Messages waiting to be written at most (credits bound the frames: far fewer)."""
DRAIN_POLL_S = 0.05
TUNNEL_ERRORS = (ConnectionClosed, OSError, TimeoutError)
"""Failures of the connection itself: they end the session, never a stream."""


class TunnelClosed(ConnectionError):
    """The tunnel's protocol closed (a protocol error, or the connection was lost)."""


async def send_stream(
    outbox: Outbox, proto: IngestProtocol, stream: IngestStream, frame_timeout_s: float
) -> None:
    """OPEN, then every frame the stream offers while credits allow, then CLOSE."""
    _check_open(proto)
    own = stream.config.tracker_settings
    times = own.to_wire() if own is not None else None
    config = stream.config
    outbox.put(proto.open_stream(stream.id, stream.window, config.tracker, times, config.model))
    while True:
        await _wait_credit(stream, frame_timeout_s)
        try:
            out = await stream.slot.get()
        except SlotClosed:
            break
        _check_open(proto)
        if not proto.is_open(stream.id):  # failed here meanwhile: nothing more to send
            break
        outbox.put(proto.send_frame(frame_header(out), out.prepared.data, time.monotonic()))
        stream.counters["sent"] += 1
        kept = stream.sent_frames  # the console's live view draws results on these
        if kept is not None:
            kept.remember(SentFrame(out.timing.epoch, out.timing.seq, out.timing.pts, out.prepared))
    await _drain(stream, frame_timeout_s)
    _check_open(proto)
    outbox.put(proto.close_stream(stream.id))


def frame_header(out: Outgoing) -> wire.Frame:
    """The FRAME header of a prepared frame (:class:`wire.InvalidMessage` when the wire
    refuses a value, e.g. the scale of a 1x1 source)."""
    lb = out.prepared.letterbox
    return wire.Frame.of(out.timing, src_w=lb.src_w, src_h=lb.src_h, scale=lb.scale)


def send_close(outbox: Outbox, proto: IngestProtocol, stream_id: str) -> None:
    """CLOSE ``stream_id`` on the worker, if the tunnel is open (behind what waits)."""
    if proto.state is not IngestState.OPEN:
        return
    with contextlib.suppress(ConnectionError):  # the writer stopped: the tunnel is closing
        outbox.put(proto.close_stream(stream_id))


def _check_open(proto: IngestProtocol) -> None:
    if proto.state is not IngestState.OPEN:
        raise TunnelClosed(f"the tunnel is {proto.state.value}")


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
