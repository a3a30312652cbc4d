"""The ingest's side of one tunnel, without I/O: what it may send, what it receives.

One :class:`IngestProtocol` per connection. The pump (the ingest's
:class:`ingest.tunnel_client.TunnelClient`, the orchestrator's canary) feeds
every WebSocket message to :meth:`IngestProtocol.receive_data` and acts on the
events; it sends what the ``*_stream``/``send_*`` methods return. The rules:

* The worker speaks first: its HELLO, exactly once (``AWAIT_HELLO`` -> ``OPEN``).
  Anything else first, or a second HELLO, is a protocol error.
* A stream is OPEN-ed before its frames; each FRAME takes a credit of the
  stream's :class:`~framerelay.credits.CreditWindow` (capped at the worker's
  ``max_inflight``), and its RESULT or ERROR gives it back.
* A SNAPSHOT of an open stream is cached in ``snapshots`` (shared across
  connections: the pump passes the same dict to every session); OPEN sends it
  back to a worker that supports :data:`~framerelay.protocol.negotiation.RESUME`.
* RESULT, ERROR and SNAPSHOT of a stream that is not open here (closed or
  forgotten: late answers) are dropped, counted in ``ignored``.
* An ERROR refusing a stream's OPEN (:data:`~framerelay.protocol.events.OPEN_REFUSALS`:
  a tracker the worker does not have, too many streams) closes that stream here
  too: it reports a :class:`~framerelay.protocol.events.PeerError` whose
  ``refuses_open`` is true, and the stream's frames in flight are given up.
* The worker never sends OPEN, CLOSE or FRAME; an undecodable message, a
  message of another version or a text message is a protocol error too. A
  protocol error is one :class:`~framerelay.protocol.events.ProtocolViolation`
  (close code and reason) and the object is ``CLOSED``: it reports nothing more.
"""

from __future__ import annotations

import enum

import msgspec

from framerelay import wire
from framerelay.credits import CreditWindow, waited_s
from framerelay.errors import ConfigError, ProtocolError
from framerelay.protocol.events import (
    FrameFailed,
    HelloReceived,
    IngestEvent,
    InvalidState,
    PeerError,
    ProtocolViolation,
    ResultReceived,
    SnapshotReceived,
)
from framerelay.protocol.negotiation import MODELS, RESUME, close_reason, has_feature

SessionSnapshot = tuple[wire.SessionClock, bytes]
"""A stream's session state as the worker last sent it: (clock, tracker blob)."""


class IngestState(enum.StrEnum):
    AWAIT_HELLO = "AWAIT_HELLO"
    """Connected; the worker's HELLO has not come yet."""
    OPEN = "OPEN"
    CLOSED = "CLOSED"
    """A protocol error was found, or the connection was lost."""


class IngestProtocol:
    """The conversation of one tunnel, from the ingest's side (see the module doc)."""

    def __init__(
        self,
        version: int = wire.VERSION,
        *,
        snapshots: dict[str, SessionSnapshot] | None = None,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
    ) -> None:
        if version not in wire.SUPPORTED_VERSIONS:
            raise ValueError(f"protocol version {version} is not one of {wire.SUPPORTED_VERSIONS}")
        self.version = version
        self.limits = limits
        self.state = IngestState.AWAIT_HELLO
        self.hello: wire.Hello | None = None
        self.snapshots: dict[str, SessionSnapshot] = {} if snapshots is None else snapshots
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.ignored = 0
        """Answers dropped because their stream is not open here."""
        self._windows: dict[str, CreditWindow] = {}
        """Credit windows of the open streams."""

    # -- receiving -------------------------------------------------------------------

    def receive_data(self, data: bytes | str, now: float) -> list[IngestEvent]:
        """Events for one WebSocket message (``now``: the monotonic clock)."""
        if self.state is IngestState.CLOSED:
            return []
        if isinstance(data, str):
            error = ProtocolError(
                "the worker sent a text message", close_code=wire.CloseCode.UNSUPPORTED_DATA
            )
            return self._violation(error)
        try:
            header, payload = wire.decode(data, self.limits, version=self.version)
            return self._dispatch(header, payload, now)
        except ProtocolError as exc:
            return self._violation(exc)

    def _dispatch(self, header: wire.Header, payload: bytes, now: float) -> list[IngestEvent]:
        if self.state is IngestState.AWAIT_HELLO:
            if not isinstance(header, wire.Hello):
                raise ProtocolError(f"expected HELLO from the worker, got {type(header).__name__}")
            self.hello, self.state = header, IngestState.OPEN
            return [HelloReceived(header)]
        if isinstance(header, wire.Result):
            return self._on_result(header, payload, now)
        if isinstance(header, wire.Error):
            return self._on_error(header, now)
        if isinstance(header, wire.Snapshot):
            return self._on_snapshot(header, payload)
        raise ProtocolError(f"unexpected {type(header).__name__} from the worker")

    def _on_result(self, header: wire.Result, payload: bytes, now: float) -> list[IngestEvent]:
        window = self._windows.get(header.stream_id)
        if window is None:
            self.ignored += 1
            return []
        detections = wire.unpack_detections(header.n, payload, self.limits)
        rtt = window.completed(header.seq, now, waited_s(header.timings))
        return [ResultReceived(header, detections, rtt)]

    def _on_error(self, header: wire.Error, now: float) -> list[IngestEvent]:
        window = self._windows.get(header.stream_id or "")
        if window is None or header.seq is None or header.stream_id is None:
            event = PeerError(header)
            if window is not None and event.refuses_open:  # not open there: not here either
                window.abandon()
                del self._windows[event.error.stream_id or ""]
            return [event]
        window.completed(header.seq, now)
        return [FrameFailed(header.stream_id, header.seq, header.code, header.message)]

    def _on_snapshot(self, header: wire.Snapshot, payload: bytes) -> list[IngestEvent]:
        if header.stream_id not in self._windows:
            self.ignored += 1
            return []
        self.snapshots[header.stream_id] = (header.clock, payload)
        return [SnapshotReceived(header.stream_id, header.seq, header.clock, payload)]

    def _violation(self, error: ProtocolError) -> list[IngestEvent]:
        self.state = IngestState.CLOSED
        self.close_code, self.close_reason = error.close_code, close_reason(str(error))
        return [ProtocolViolation(error, self.close_code, self.close_reason)]

    # -- sending ---------------------------------------------------------------------

    def open_stream(
        self,
        stream_id: str,
        window: CreditWindow,
        tracker: str = "default",
        times: wire.TrackerTimes | None = None,
        model: str | None = None,
    ) -> bytes:
        """OPEN ``stream_id`` (resuming its cached snapshot where the worker can); its
        frames take credits of ``window``, capped at the worker's ``max_inflight``.
        ``times``: the stream's own tracker time settings, if any; ``model``: the model
        it names (ConfigError when the worker serves no named models)."""
        hello = self._hello("OPEN")
        if model is not None and not has_feature(hello, self.version, MODELS):
            raise ConfigError(
                f"stream {stream_id} names model {model!r}, but worker {hello.worker_id} "
                "serves only its one model (no 'models' feature): upgrade the worker"
            )
        named: str | msgspec.UnsetType = msgspec.UNSET if model is None else model
        window.cap = min(window.cap, hello.max_inflight)
        window.limit = min(window.limit, window.cap)
        snap = self.snapshots.get(stream_id)
        own: wire.TrackerTimes | msgspec.UnsetType = msgspec.UNSET if times is None else times
        if snap is not None and has_feature(hello, self.version, RESUME):
            header = wire.Open(
                stream_id=stream_id, tracker=tracker, clock=snap[0], tracker_settings=own,
                model=named,
            )  # fmt: skip
            data = self._encode(header, snap[1])
        else:
            data = self._encode(
                wire.Open(stream_id=stream_id, tracker=tracker, tracker_settings=own, model=named)
            )
        self._windows[stream_id] = window
        return data

    def send_frame(self, frame: wire.Frame, payload: bytes, now: float) -> bytes:
        """FRAME of an open stream; takes a credit (the caller checks ``can_send``)."""
        if self.state is not IngestState.OPEN:
            self._hello("FRAME")
        window = self._windows.get(frame.stream_id)
        if window is None:
            raise InvalidState(f"stream {frame.stream_id}: send OPEN before FRAME")
        data = self._encode(frame, payload)
        if not window.take(frame.seq, now):
            raise InvalidState(
                f"stream {frame.stream_id}: no credit for frame {frame.seq} "
                f"({len(window.inflight)}/{window.limit} in flight)"
            )
        return data

    def close_stream(self, stream_id: str) -> bytes:
        """CLOSE ``stream_id``: the worker frees its session; later answers are dropped."""
        self._hello("CLOSE")
        self._windows.pop(stream_id, None)
        return self._encode(wire.Close(stream_id=stream_id))

    def can_send(self, stream_id: str) -> bool:
        window = self._windows.get(stream_id)
        return self.state is IngestState.OPEN and window is not None and window.can_send()

    def is_open(self, stream_id: str) -> bool:
        return stream_id in self._windows

    def forget(self, stream_id: str) -> None:
        """Stop the conversation of ``stream_id`` here without telling the worker (its
        answers are dropped from now on)."""
        self._windows.pop(stream_id, None)

    def connection_lost(self) -> dict[str, int]:
        """The connection is gone: every frame in flight is given up. Returns how many
        per stream."""
        self.state = IngestState.CLOSED
        lost = {sid: window.abandon() for sid, window in self._windows.items()}
        self._windows.clear()
        return lost

    def _hello(self, what: str) -> wire.Hello:
        if self.state is not IngestState.OPEN or self.hello is None:
            raise InvalidState(f"cannot send {what}: the tunnel is {self.state.value}")
        return self.hello

    def _encode(self, header: wire.Header, payload: bytes = b"") -> bytes:
        return wire.encode(header, payload, self.limits, version=self.version)
