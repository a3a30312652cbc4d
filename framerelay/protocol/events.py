"""What a tunnel protocol object reports: typed events, one list per message received.

Both sides (:mod:`framerelay.protocol.ingest_side`,
:mod:`framerelay.protocol.worker_side`) turn one WebSocket message into a list
of these. An event that needs an answer on the wire carries its bytes
(``reply``): the pump sends them and does nothing else with the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from framerelay import wire
from framerelay.detections import Detections
from framerelay.errors import FramerelayError, ProtocolError


class InvalidState(FramerelayError):
    """This side asked its protocol object for something its state does not allow
    (a FRAME before OPEN, sending on a closed tunnel): a bug in the caller."""


# -- both sides -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """The peer broke the protocol: close the tunnel with ``code`` and ``reason``,
    after sending ``reply`` (if any). The protocol object is CLOSED from here on."""

    error: ProtocolError
    code: int
    reason: str
    reply: bytes | None = None


# -- received by the ingest -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The worker's HELLO: the tunnel is open."""

    hello: wire.Hello


@dataclass(slots=True)  # one per frame: not frozen, a quarter of a microsecond cheaper
class ResultReceived:
    """Detections of a frame in flight; its credit is back (``rtt_s``: its round trip,
    None when the frame was no longer in flight, e.g. given up as late)."""

    result: wire.Result
    detections: Detections
    rtt_s: float | None

    @property
    def stream_id(self) -> str:
        return self.result.stream_id


@dataclass(frozen=True, slots=True)
class FrameFailed:
    """The worker answered frame ``seq`` of ``stream_id`` with an ERROR; its credit is back."""

    stream_id: str
    seq: int
    code: str
    message: str


OPEN_REFUSALS = frozenset(
    {"bad_tracker", "too_many_streams", "unknown_model", "bad_model", "model_capacity"}
)
"""ERROR codes by which a worker refuses a stream's OPEN: the stream is not open there."""


@dataclass(frozen=True, slots=True)
class PeerError:
    """An ERROR about no frame of an open stream (the tunnel, an OPEN, a closed stream)."""

    error: wire.Error

    @property
    def stream_id(self) -> str | None:
        return self.error.stream_id

    @property
    def refuses_open(self) -> bool:
        """The worker refused the OPEN of ``stream_id`` (see :data:`OPEN_REFUSALS`)."""
        e = self.error
        return e.stream_id is not None and e.seq is None and e.code in OPEN_REFUSALS


@dataclass(frozen=True, slots=True)
class SnapshotReceived:
    """A session snapshot of an open stream; the protocol object has cached it."""

    stream_id: str
    seq: int
    clock: wire.SessionClock
    blob: bytes


# -- received by the worker -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamOpened:
    """OPEN of ``stream_id`` (``snapshot``: the tracker blob to resume, or b"").
    ``reopened``: it was open already (a restart of the stream)."""

    open: wire.Open
    snapshot: bytes
    reopened: bool


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """CLOSE of ``stream_id``; ``known``: it was open."""

    stream_id: str
    known: bool


@dataclass(slots=True)  # one per frame: not frozen, a quarter of a microsecond cheaper
class FrameReceived:
    """A FRAME of an open stream, within its credit; the frame holds a credit until
    the worker sends its RESULT or an ERROR for it."""

    frame: wire.Frame
    payload: bytes | memoryview
    """The JPEG: a view into the WebSocket message as the worker's protocol gives it."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The protocol object refused a message itself (``code``: ``bad_frame``,
    ``unknown_stream``, ``credit_exceeded``, ``too_many_streams``); ``reply`` is the
    ERROR to send."""

    code: str
    message: str
    stream_id: str | None
    seq: int | None
    reply: bytes


IngestEvent = (
    HelloReceived | ResultReceived | FrameFailed | PeerError | SnapshotReceived | ProtocolViolation
)
WorkerEvent = StreamOpened | StreamClosed | FrameReceived | Refused | ProtocolViolation


def probe_failure(event: IngestEvent) -> str | None:
    """Why a one-stream probe (a canary, a round-trip probe) cannot go on after ``event``:
    the worker answered its frame with an ERROR, refused its OPEN, or broke the protocol;
    None for any other event."""
    if isinstance(event, FrameFailed):
        return f"the worker answered the frame with {event.code}"
    if isinstance(event, PeerError) and event.refuses_open:
        return f"the worker refused the stream: {event.error.code}: {event.error.message}"
    if isinstance(event, ProtocolViolation):
        return f"protocol error: {event.reason}"
    return None
