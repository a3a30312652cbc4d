"""The worker side of the tunnel protocol, with bytes only (no socket).

Every message type in every state, legal or not; then the per-stream rules
(OPEN before FRAME, credits given back by RESULT and ERROR, stream limits) and
the local calls a state forbids.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from framerelay import wire
from framerelay.protocol import (
    FrameReceived,
    InvalidState,
    ProtocolViolation,
    Refused,
    StreamClosed,
    StreamOpened,
    WorkerProtocol,
    WorkerState,
)
from tests.framerelay import wire_golden as golden

SID = "cam-1"
ALL = ["hello", "open", "close", "frame", "result", "error_frame", "snapshot"]
FROM_INGEST_OK = {"open": StreamOpened, "close": StreamClosed, "frame": FrameReceived}


def _data(name: str, version: int = 2) -> bytes:
    return golden.golden(version, name)


def _frame(seq: int, sid: str = SID) -> bytes:
    frame, payload = golden.message("frame")
    return wire.encode(msgspec.structs.replace(frame, seq=seq, stream_id=sid), payload)


def _in(state: WorkerState, version: int = 2, max_inflight: int = 2) -> WorkerProtocol:
    """A protocol object in ``state``; when OPEN, stream cam-1 is open."""
    proto = WorkerProtocol(version, max_streams=2, max_inflight=max_inflight)
    if state is WorkerState.CONNECTING:
        return proto
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    proto.send_hello(hello)
    assert isinstance(proto.receive_data(_data("open", version))[0], StreamOpened)
    if state is WorkerState.CLOSED:
        proto.close()
    assert proto.state is state
    return proto


def _decoded(reply: bytes | None) -> wire.Error:
    assert reply is not None
    header, _ = wire.decode(reply)
    assert isinstance(header, wire.Error)
    return header


@pytest.mark.parametrize("name", ALL)
def test_connecting_takes_nothing_before_the_hello(name: str) -> None:
    proto = _in(WorkerState.CONNECTING)
    [event] = proto.receive_data(_data(name))
    assert isinstance(event, ProtocolViolation) and "before the worker's HELLO" in event.reason
    assert proto.state is WorkerState.CLOSED


@pytest.mark.parametrize("name", ALL)
def test_open_takes_what_an_ingest_sends_and_refuses_the_rest(name: str) -> None:
    proto = _in(WorkerState.OPEN)
    events = proto.receive_data(_data(name))
    expected = FROM_INGEST_OK.get(name)
    if expected is not None:
        assert len(events) == 1 and isinstance(events[0], expected)
        assert proto.state is WorkerState.OPEN
        return
    [event] = events
    assert isinstance(event, ProtocolViolation) and event.code == wire.CloseCode.PROTOCOL
    assert event.reason.endswith("is not accepted from an ingest")
    error = _decoded(event.reply)
    assert error.code == "protocol" and error.stream_id is None
    assert proto.state is WorkerState.CLOSED


@pytest.mark.parametrize("name", [*ALL, "text"])
def test_closed_reports_nothing_more(name: str) -> None:
    proto = _in(WorkerState.CLOSED)
    assert proto.receive_data("text" if name == "text" else _data(name)) == []


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        ("a text message", 1003, "text messages are not part of the protocol"),
        (b"", 1002, "shorter than"),
        (golden.golden(1, "frame"), 1002, "version 1 on a tunnel that agreed on version 2"),
        (wire.PREFIX.pack(2, 4, 1 << 20), 1009, "exceeds"),
        (wire.PREFIX.pack(2, 4, 5) + b"{oops", 1002, "invalid Frame header"),
        (wire.PREFIX.pack(2, 3, 12) + b'{"stream":1}', 1002, "stream_id"),
    ],
)
def test_undecodable_messages_are_a_defined_close(
    data: bytes | str, code: int, needle: str
) -> None:
    proto = _in(WorkerState.OPEN)
    [event] = proto.receive_data(data)
    assert isinstance(event, ProtocolViolation) and event.code == code and needle in event.reason
    assert _decoded(event.reply).code == "protocol"
    assert proto.close_code == code and proto.state is WorkerState.CLOSED


def test_a_frame_with_a_bad_but_readable_header_is_refused_alone() -> None:
    proto = _in(WorkerState.OPEN)
    frame, payload = golden.message("frame")
    head = msgspec.to_builtins(frame)
    head["scale"] = 1e9
    raw = json.dumps(head).encode()
    [event] = proto.receive_data(wire.PREFIX.pack(2, 4, len(raw)) + raw + payload)
    assert isinstance(event, Refused) and event.code == "bad_frame"
    assert (event.stream_id, event.seq) == (SID, 7) and "scale" in event.message
    assert _decoded(event.reply).seq == 7
    assert proto.state is WorkerState.OPEN and proto.inflight(SID) == 0


def test_frames_need_an_open_stream() -> None:
    proto = _in(WorkerState.OPEN)
    [event] = proto.receive_data(_frame(1, "other"))
    assert isinstance(event, Refused) and event.code == "unknown_stream"
    assert event.message == "send OPEN before frames" and _decoded(event.reply).seq == 1
    proto.receive_data(_data("close"))
    [again] = proto.receive_data(_frame(2))
    assert isinstance(again, Refused) and again.code == "unknown_stream"


def test_credits_are_held_until_a_result_or_an_error() -> None:
    proto = _in(WorkerState.OPEN, max_inflight=2)
    first, second = (proto.receive_data(_frame(s))[0] for s in (1, 2))
    assert isinstance(first, FrameReceived) and isinstance(second, FrameReceived)
    [over] = proto.receive_data(_frame(3))
    assert isinstance(over, Refused) and over.code == "credit_exceeded"
    result, payload = golden.message("result_empty")
    assert isinstance(result, wire.Result)
    assert proto.send_result(result, payload) == _data("result_empty")
    assert proto.inflight(SID) == 1
    assert isinstance(proto.receive_data(_frame(4))[0], FrameReceived)
    error = proto.send_error("bad_image", "not a JPEG", SID, 7)
    assert error == _data("error_frame") and proto.inflight(SID) == 1
    proto.send_error("bad_snapshot", "no frame named", SID)  # names no frame: no credit
    assert proto.inflight(SID) == 1


def test_frames_in_flight_are_kept_across_a_reopen() -> None:
    proto = _in(WorkerState.OPEN, max_inflight=1)
    assert isinstance(proto.receive_data(_frame(1))[0], FrameReceived)
    [reopen] = proto.receive_data(_data("open"))
    assert isinstance(reopen, StreamOpened) and reopen.reopened
    [over] = proto.receive_data(_frame(2))
    assert isinstance(over, Refused) and over.code == "credit_exceeded"


def test_close_of_an_unknown_stream_is_reported_as_such() -> None:
    proto = _in(WorkerState.OPEN)
    assert proto.receive_data(_data("close")) == [StreamClosed(SID, True)]
    assert proto.receive_data(_data("close")) == [StreamClosed(SID, False)]
    assert proto.streams == frozenset()


def test_too_many_streams_are_refused() -> None:
    proto = _in(WorkerState.OPEN)  # max_streams 2, cam-1 open
    other = wire.encode(wire.Open(stream_id="cam-2"))
    assert isinstance(proto.receive_data(other)[0], StreamOpened)
    [refused] = proto.receive_data(wire.encode(wire.Open(stream_id="cam-3")))
    assert isinstance(refused, Refused) and refused.code == "too_many_streams"
    assert refused.seq is None and proto.streams == {"cam-1", "cam-2"}


def test_open_carries_the_snapshot_to_resume() -> None:
    proto = _in(WorkerState.OPEN)
    [event] = proto.receive_data(_data("open_resume"))
    assert isinstance(event, StreamOpened) and event.reopened
    assert event.open.clock == wire.SessionClock(**golden.CLOCK)
    assert event.snapshot == b"FRTK\x00tracker-state"


def test_a_refused_open_leaves_a_new_stream_closed_and_an_old_one_open() -> None:
    proto = _in(WorkerState.OPEN)
    [new] = proto.receive_data(wire.encode(wire.Open(stream_id="cam-2", tracker="nope")))
    assert isinstance(new, StreamOpened)
    reply = proto.refuse_open(new, "bad_tracker", "no tracker 'nope'")
    assert _decoded(reply).code == "bad_tracker" and "cam-2" not in proto.streams
    [old] = proto.receive_data(_data("open"))
    assert isinstance(old, StreamOpened)
    proto.refuse_open(old, "bad_tracker", "no such tracker")
    assert SID in proto.streams


def test_local_calls_a_state_forbids() -> None:
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    result, payload = golden.message("result")
    assert isinstance(result, wire.Result)
    proto = WorkerProtocol(max_streams=1, max_inflight=1)
    with pytest.raises(InvalidState, match="CONNECTING"):
        proto.send_result(result, payload)
    assert proto.send_hello(hello) == _data("hello")
    with pytest.raises(InvalidState, match="HELLO is sent once"):
        proto.send_hello(hello)
    proto.close()
    with pytest.raises(InvalidState, match="CLOSED"):
        proto.send_error("x", "y")


def test_a_v1_tunnel_speaks_v1() -> None:
    proto = WorkerProtocol(1, max_streams=1, max_inflight=1)
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    assert proto.send_hello(hello) == _data("hello", 1)
    assert isinstance(proto.receive_data(_data("open", 1))[0], StreamOpened)
    assert isinstance(proto.receive_data(_data("frame", 1))[0], FrameReceived)
    [wrong] = proto.receive_data(_data("close", 2))
    assert isinstance(wrong, ProtocolViolation) and "version 2" in wrong.reason


@pytest.mark.parametrize(("streams", "inflight"), [(0, 1), (1, 0)])
def test_limits_must_be_positive(streams: int, inflight: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        WorkerProtocol(max_streams=streams, max_inflight=inflight)


def test_a_frames_jpeg_is_a_view_and_a_snapshot_is_bytes() -> None:
    """The JPEG is handed on without a copy; an OPEN's snapshot is kept, so it is copied
    out of the message."""
    proto = _in(WorkerState.OPEN)
    data = _frame(1)
    (got,) = proto.receive_data(data)
    assert isinstance(got, FrameReceived) and isinstance(got.payload, memoryview)
    assert got.payload.obj is data and got.payload == golden.message("frame")[1]
    (opened,) = proto.receive_data(_data("open_resume"))
    assert isinstance(opened, StreamOpened) and type(opened.snapshot) is bytes
