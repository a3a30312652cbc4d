"""The ingest side of the tunnel protocol, with bytes only (no socket).

Every message type in every state, legal or not; then the per-stream rules
(credits, late answers, snapshots) and the local calls a state forbids.
"""

from __future__ import annotations

import msgspec
import pytest

from framerelay import wire
from framerelay.credits import CreditWindow
from framerelay.errors import ProtocolError
from framerelay.protocol import (
    FrameFailed,
    HelloReceived,
    IngestProtocol,
    IngestState,
    InvalidState,
    PeerError,
    ProtocolViolation,
    ResultReceived,
    SnapshotReceived,
)
from tests.framerelay import wire_golden as golden

SID = "cam-1"
"""The stream of every canonical message."""
ALL = ["hello", "open", "close", "frame", "result", "error_frame", "snapshot"]
"""One message of each type, as the worker would have to send it (v2)."""
FROM_WORKER_OK = {
    "result": ResultReceived,
    "error_frame": FrameFailed,
    "snapshot": SnapshotReceived,
}


def _data(name: str, version: int = 2) -> bytes:
    return golden.golden(version, name)


def _in(state: IngestState, version: int = 2) -> tuple[IngestProtocol, CreditWindow]:
    """A protocol object in ``state``; when OPEN, stream cam-1 is open with frame 7 in flight."""
    proto, window = IngestProtocol(version), CreditWindow(cap=4, limit=4)
    if state is IngestState.AWAIT_HELLO:
        return proto, window
    assert isinstance(proto.receive_data(_data("hello", version), 0.0)[0], HelloReceived)
    proto.open_stream(SID, window)
    frame, payload = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    proto.send_frame(frame, payload, now=1.0)
    if state is IngestState.CLOSED:
        proto.connection_lost()
    assert proto.state is state
    return proto, window


@pytest.mark.parametrize("name", ALL)
def test_await_hello_takes_only_hello(name: str) -> None:
    proto, _ = _in(IngestState.AWAIT_HELLO)
    events = proto.receive_data(_data(name), 0.0)
    if name == "hello":
        assert events == [HelloReceived(golden.message("hello")[0])]  # type: ignore[arg-type]
        assert proto.state is IngestState.OPEN
        return
    assert len(events) == 1 and isinstance(events[0], ProtocolViolation)
    assert events[0].code == wire.CloseCode.PROTOCOL
    assert events[0].reason.startswith("expected HELLO from the worker, got ")
    assert proto.state is IngestState.CLOSED


@pytest.mark.parametrize("name", ALL)
def test_open_takes_answers_and_refuses_the_rest(name: str) -> None:
    proto, window = _in(IngestState.OPEN)
    events = proto.receive_data(_data(name), now=1.5)
    expected = FROM_WORKER_OK.get(name)
    if expected is None:  # HELLO again, or what only an ingest sends
        assert len(events) == 1 and isinstance(events[0], ProtocolViolation)
        assert events[0].reason.startswith("unexpected ")
        assert events[0].reason.endswith(" from the worker")
        assert proto.state is IngestState.CLOSED
        return
    assert len(events) == 1 and isinstance(events[0], expected)
    assert proto.state is IngestState.OPEN
    answered = name != "snapshot"
    assert (7 not in window.inflight) is answered  # a RESULT or an ERROR gives the credit back


@pytest.mark.parametrize("name", [*ALL, "text", "garbage"])
def test_closed_reports_nothing_more(name: str) -> None:
    proto, _ = _in(IngestState.CLOSED)
    odd: dict[str, bytes | str] = {"text": "hi", "garbage": b"\x00"}
    data = odd[name] if name in odd else _data(name)
    assert proto.receive_data(data, 2.0) == []


@pytest.mark.parametrize("state", [IngestState.AWAIT_HELLO, IngestState.OPEN])
@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        ("a text message", 1003, "text message"),
        (b"\x02\x05", 1002, "shorter than"),
        (golden.golden(1, "result"), 1002, "version 1 on a tunnel that agreed on version 2"),
        (wire.PREFIX.pack(2, 5, 1 << 20), 1009, "exceeds"),
        (wire.PREFIX.pack(2, 99, 2) + b"{}", 1002, "unknown message type 99"),
    ],
)
def test_undecodable_messages_are_a_defined_close(
    state: IngestState, data: bytes | str, code: int, needle: str
) -> None:
    proto, _ = _in(state)
    [event] = proto.receive_data(data, 1.0)
    assert isinstance(event, ProtocolViolation) and event.code == code and needle in event.reason
    assert (proto.close_code, proto.close_reason) == (code, event.reason)
    assert len(event.reason.encode()) <= 123 and proto.state is IngestState.CLOSED


def test_a_result_returns_the_credit_and_measures_the_round_trip() -> None:
    proto, window = _in(IngestState.OPEN)
    [event] = proto.receive_data(_data("result"), now=1.25)
    assert isinstance(event, ResultReceived)
    assert event.stream_id == SID and event.rtt_s == pytest.approx(0.25)
    assert event.detections.equals(golden.DETECTIONS)
    assert window.inflight == {} and window.own_rtt_s is not None


def test_a_frame_error_returns_the_credit() -> None:
    proto, window = _in(IngestState.OPEN)
    [event] = proto.receive_data(_data("error_frame"), now=1.25)
    assert event == FrameFailed(SID, 7, "bad_image", "not a JPEG")
    assert window.inflight == {}


def test_an_error_of_no_frame_is_a_peer_error() -> None:
    proto, window = _in(IngestState.OPEN)
    [event] = proto.receive_data(_data("error_tunnel"), now=1.25)
    assert isinstance(event, PeerError) and event.error.code == "protocol"
    assert event.stream_id is None and window.inflight  # no credit came back


@pytest.mark.parametrize(
    ("code", "refuses"),
    [("bad_tracker", True), ("too_many_streams", True), ("bad_snapshot", False)],
)
def test_an_error_refusing_a_streams_open_closes_it_here_too(code: str, refuses: bool) -> None:
    """The worker refused the OPEN: the stream is not open there, so not here either (its
    frames in flight are given up; late answers are dropped). ``bad_snapshot`` only says the
    worker started a new session instead of resuming: the stream stays open."""
    proto, window = _in(IngestState.OPEN)
    error = wire.Error(code=code, message="no", stream_id=SID)
    [event] = proto.receive_data(wire.encode(error), now=1.25)
    assert isinstance(event, PeerError) and event.refuses_open is refuses
    assert proto.is_open(SID) is not refuses
    assert bool(window.inflight) is not refuses


@pytest.mark.parametrize("name", ["result", "snapshot"])
def test_answers_for_a_stream_not_open_are_dropped(name: str) -> None:
    proto, _ = _in(IngestState.OPEN)
    proto.close_stream(SID)
    assert proto.receive_data(_data(name), 2.0) == []
    assert proto.ignored == 1 and proto.state is IngestState.OPEN
    assert proto.snapshots == {}


def test_an_error_for_a_stream_not_open_is_a_peer_error() -> None:
    proto, _ = _in(IngestState.OPEN)
    proto.forget(SID)
    [event] = proto.receive_data(_data("error_frame"), 2.0)
    assert isinstance(event, PeerError)


def test_a_bad_detections_payload_is_a_protocol_error() -> None:
    proto, _ = _in(IngestState.OPEN)
    data = _data("result")[:-1]  # one byte short of two detections
    [event] = proto.receive_data(data, 2.0)
    assert isinstance(event, ProtocolViolation) and "result payload is" in event.reason


def test_snapshots_are_cached_and_resumed_on_the_next_open() -> None:
    shared: dict[str, tuple[wire.SessionClock, bytes]] = {}
    proto = IngestProtocol(snapshots=shared)
    proto.receive_data(_data("hello"), 0.0)
    proto.open_stream(SID, CreditWindow())
    [event] = proto.receive_data(_data("snapshot"), 1.0)
    assert isinstance(event, SnapshotReceived) and event.seq == 41
    assert shared[SID] == (event.clock, event.blob)
    proto.connection_lost()
    again = IngestProtocol(snapshots=shared)  # the next session
    again.receive_data(_data("hello"), 0.0)
    assert again.open_stream(SID, CreditWindow()) == _data("open_resume")


def test_no_resume_for_a_worker_without_the_feature() -> None:
    hello, _ = golden.message("hello")
    plain = msgspec.structs.replace(hello, features=["snapshots"])
    clock = wire.SessionClock(**golden.CLOCK)
    proto = IngestProtocol(snapshots={SID: (clock, b"blob")})
    proto.receive_data(wire.encode(plain), 0.0)
    assert proto.open_stream(SID, CreditWindow()) == _data("open")


def test_a_v1_worker_resumes_by_default() -> None:
    proto = IngestProtocol(1, snapshots={SID: (wire.SessionClock(**golden.CLOCK), b"x")})
    proto.receive_data(_data("hello", 1), 0.0)
    data = proto.open_stream(SID, CreditWindow())
    assert data[0] == 1 and b'"clock"' in data


def test_credits_are_capped_at_the_workers_max_inflight() -> None:
    proto = IngestProtocol()
    proto.receive_data(_data("hello"), 0.0)  # max_inflight 4
    window = CreditWindow(cap=16, limit=16)
    proto.open_stream(SID, window)
    assert (window.cap, window.limit) == (4, 4)
    frame, payload = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    for seq in range(4):
        proto.send_frame(msgspec.structs.replace(frame, seq=seq), payload, 0.0)
    assert not proto.can_send(SID)
    with pytest.raises(InvalidState, match="no credit"):
        proto.send_frame(msgspec.structs.replace(frame, seq=9), payload, 0.0)


def test_frame_before_open_and_sending_before_hello_are_refused_locally() -> None:
    frame, payload = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    proto = IngestProtocol()
    with pytest.raises(InvalidState, match="AWAIT_HELLO"):
        proto.open_stream(SID, CreditWindow())
    proto.receive_data(_data("hello"), 0.0)
    with pytest.raises(InvalidState, match="send OPEN before FRAME"):
        proto.send_frame(frame, payload, 0.0)
    proto.connection_lost()
    with pytest.raises(InvalidState, match="CLOSED"):
        proto.close_stream(SID)


def test_a_frame_too_big_for_the_wire_takes_no_credit() -> None:
    proto, window = _in(IngestState.OPEN)
    frame, _ = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    with pytest.raises(ProtocolError, match="exceeds"):
        proto.send_frame(msgspec.structs.replace(frame, seq=8), b"x" * (9 << 20), 1.0)
    assert list(window.inflight) == [7]


def test_connection_lost_gives_up_every_frame_in_flight() -> None:
    proto, window = _in(IngestState.OPEN)
    assert proto.connection_lost() == {SID: 1}
    assert window.inflight == {} and proto.state is IngestState.CLOSED
    assert not proto.is_open(SID)


def test_an_unsupported_version_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="not one of"):
        IngestProtocol(3)
