"""The worker's side of one tunnel, without I/O: what it accepts, what it answers.

One :class:`WorkerProtocol` per connection; the pump
(:class:`gpu_worker.connection.TunnelConnection`) sends :meth:`send_hello`'s
bytes first, feeds every message to :meth:`WorkerProtocol.receive_data` and
sends what the events' ``reply`` and the ``send_*`` methods return. The rules:

* The worker speaks first: HELLO (``CONNECTING`` -> ``OPEN``). A message
  before that is a protocol error.
* OPEN starts (or restarts) a stream, at most ``max_streams`` at a time;
  CLOSE ends it. A FRAME of a stream that is not open is refused
  (``unknown_stream``), as is one beyond ``max_inflight`` frames in flight
  (``credit_exceeded``); frames in flight are counted per stream across a
  re-OPEN. A frame holds its credit until :meth:`send_result` or
  :meth:`send_error` answers it.
* A FRAME whose header is invalid but names its stream and seq is refused
  alone (``bad_frame``); the tunnel goes on.
* The ingest never sends HELLO, RESULT, ERROR or SNAPSHOT; those, an
  undecodable message, a message of another version and a text message are
  protocol errors: one :class:`~framerelay.protocol.events.ProtocolViolation`
  (an ERROR ``protocol`` to send, then the close code and reason) and the
  object is ``CLOSED``: it reports nothing more.
"""

from __future__ import annotations

import enum

from framerelay import wire
from framerelay.errors import ProtocolError
from framerelay.protocol.events import (
    FrameReceived,
    InvalidState,
    ProtocolViolation,
    Refused,
    StreamClosed,
    StreamOpened,
    WorkerEvent,
)
from framerelay.protocol.negotiation import close_reason

MAX_MESSAGE = 2000
"""An ERROR's message is cut to this many characters (the wire's limit)."""


class WorkerState(enum.StrEnum):
    CONNECTING = "CONNECTING"
    """Upgraded; this side's HELLO is not sent yet."""
    OPEN = "OPEN"
    CLOSED = "CLOSED"
    """A protocol error was found, or :meth:`WorkerProtocol.close` was called."""


class WorkerProtocol:
    """The conversation of one tunnel, from the worker's side (see the module doc)."""

    def __init__(
        self,
        version: int = wire.VERSION,
        *,
        max_streams: int,
        max_inflight: int,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
    ) -> None:
        if version not in wire.SUPPORTED_VERSIONS:
            raise ValueError(f"protocol version {version} is not one of {wire.SUPPORTED_VERSIONS}")
        if max_streams < 1 or max_inflight < 1:
            raise ValueError(
                f"need max_streams, max_inflight >= 1, got {max_streams}, {max_inflight}"
            )
        self.version = version
        self.max_streams = max_streams
        self.max_inflight = max_inflight
        self.limits = limits
        self.state = WorkerState.CONNECTING
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._open: set[str] = set()
        self._inflight: dict[str, int] = {}

    @property
    def streams(self) -> frozenset[str]:
        """The open streams."""
        return frozenset(self._open)

    def inflight(self, stream_id: str) -> int:
        return self._inflight.get(stream_id, 0)

    # -- receiving -------------------------------------------------------------------

    def receive_data(self, data: bytes | str) -> list[WorkerEvent]:
        """Events for one WebSocket message from the ingest."""
        if self.state is WorkerState.CLOSED:
            return []
        if self.state is WorkerState.CONNECTING:
            return self._violation(ProtocolError("a message before the worker's HELLO"))
        if isinstance(data, str):
            error = ProtocolError(
                "text messages are not part of the protocol",
                close_code=wire.CloseCode.UNSUPPORTED_DATA,
            )
            return self._violation(error)
        try:
            header, payload = wire.decode_view(data, self.limits, version=self.version)
        except wire.FrameError as exc:
            return [self._refuse("bad_frame", str(exc), exc.stream_id, exc.seq)]
        except ProtocolError as exc:
            return self._violation(exc)
        return self._dispatch(header, payload)

    def _dispatch(self, header: wire.Header, payload: memoryview) -> list[WorkerEvent]:
        if isinstance(header, wire.Frame):
            return [self._on_frame(header, payload)]  # a view: the JPEG is not copied
        if isinstance(header, wire.Open):
            return [self._on_open(header, bytes(payload))]
        if isinstance(header, wire.Close):
            known = header.stream_id in self._open
            self._open.discard(header.stream_id)
            return [StreamClosed(header.stream_id, known)]
        error = ProtocolError(f"{type(header).__name__} is not accepted from an ingest")
        return self._violation(error)

    def _on_frame(self, frame: wire.Frame, payload: memoryview) -> WorkerEvent:
        sid = frame.stream_id
        if sid not in self._open:
            return self._refuse("unknown_stream", "send OPEN before frames", sid, frame.seq)
        inflight = self._inflight.get(sid, 0)
        if inflight >= self.max_inflight:
            message = f"at most {self.max_inflight} frames in flight per stream"
            return self._refuse("credit_exceeded", message, sid, frame.seq)
        self._inflight[sid] = inflight + 1
        return FrameReceived(frame, payload)

    def _on_open(self, header: wire.Open, payload: bytes) -> WorkerEvent:
        sid = header.stream_id
        reopened = sid in self._open
        if not reopened and len(self._open) >= self.max_streams:
            message = f"limit is {self.max_streams} streams per tunnel"
            return self._refuse("too_many_streams", message, sid, None)
        self._open.add(sid)
        return StreamOpened(header, payload, reopened)

    def _refuse(self, code: str, message: str, sid: str | None, seq: int | None) -> Refused:
        return Refused(code, message, sid, seq, self._error(code, message, sid, seq))

    def _violation(self, error: ProtocolError) -> list[WorkerEvent]:
        self.state = WorkerState.CLOSED
        self.close_code, self.close_reason = error.close_code, close_reason(str(error))
        reply = self._error("protocol", str(error), None, None)
        return [ProtocolViolation(error, self.close_code, self.close_reason, reply)]

    # -- sending ---------------------------------------------------------------------

    def send_hello(self, hello: wire.Hello) -> bytes:
        """The first message of the tunnel."""
        if self.state is not WorkerState.CONNECTING:
            raise InvalidState(f"HELLO is sent once, first; the tunnel is {self.state.value}")
        self.state = WorkerState.OPEN
        return self._encode(hello)

    def send_result(self, result: wire.Result, payload: bytes) -> bytes:
        """RESULT of a frame received: gives its credit back."""
        self._require_open("RESULT")
        self._release(result.stream_id)
        return self._encode(result, payload)

    def send_snapshot(self, snapshot: wire.Snapshot, blob: bytes) -> bytes:
        self._require_open("SNAPSHOT")
        return self._encode(snapshot, blob)

    def send_error(
        self, code: str, message: str, stream_id: str | None = None, seq: int | None = None
    ) -> bytes:
        """ERROR; one naming a frame (``seq``) answers it and gives its credit back."""
        self._require_open("ERROR")
        if stream_id is not None and seq is not None:
            self._release(stream_id)
        return self._error(code, message, stream_id, seq)

    def refuse_open(self, opened: StreamOpened, code: str, message: str) -> bytes:
        """The pump could not start the session ``opened`` asked for: ERROR ``code``;
        a stream that was not open before stays closed."""
        self._require_open("ERROR")
        if not opened.reopened:
            self._open.discard(opened.open.stream_id)
        return self._error(code, message, opened.open.stream_id, None)

    def close(self) -> None:
        """This side closes the tunnel (the pump sends the close frame)."""
        self.state = WorkerState.CLOSED

    def _release(self, stream_id: str) -> None:
        left = self._inflight.pop(stream_id, 0) - 1
        if left > 0:
            self._inflight[stream_id] = left

    def _require_open(self, what: str) -> None:
        if self.state is not WorkerState.OPEN:
            raise InvalidState(f"cannot send {what}: the tunnel is {self.state.value}")

    def _error(self, code: str, message: str, sid: str | None, seq: int | None) -> bytes:
        header = wire.Error(code=code, message=message[:MAX_MESSAGE], stream_id=sid, seq=seq)
        return self._encode(header)

    def _encode(self, header: wire.Header, payload: bytes = b"") -> bytes:
        return wire.encode(header, payload, self.limits, version=self.version)
