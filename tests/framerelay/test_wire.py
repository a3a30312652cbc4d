"""The wire codec, with bytes only."""

from __future__ import annotations

import struct

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framerelay import wire
from framerelay.detections import Detections
from framerelay.errors import ProtocolError
from framerelay.results import ResultRecord

FRAME = wire.Frame(
    stream_id="cam-1", epoch=2, seq=7, pts=8_589_934_000, time_base=(1, 90_000),
    captured_at=1_700_000_000.25, src_w=1280, src_h=720, scale=0.325,
)  # fmt: skip


def _frame_json() -> str:
    return msgspec.json.encode(FRAME).decode()


def raw(mtype: int, header: bytes, payload: bytes = b"", version: int = wire.VERSION) -> bytes:
    return struct.pack(">BBI", version, mtype, len(header)) + header + payload


def test_frame_round_trip_keeps_timing_and_payload() -> None:
    data = wire.encode(FRAME, b"\xff\xd8jpeg")
    header, payload = wire.decode(data)
    assert header == FRAME
    assert payload == b"\xff\xd8jpeg"
    assert isinstance(header, wire.Frame)
    assert header.pts_time == pytest.approx(8_589_934_000 / 90_000)


def test_layout_is_version_type_length_header_payload() -> None:
    data = wire.encode(wire.Close(stream_id="a"), b"")
    assert data[0] == wire.VERSION
    assert data[1] == wire.MsgType.CLOSE
    (hlen,) = struct.unpack(">I", data[2:6])
    assert data[6 : 6 + hlen] == b'{"stream_id":"a"}'


def test_result_round_trip_with_detections() -> None:
    det = Detections(
        xyxy=np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32),
        confidence=np.array([0.9, 0.2], np.float32),
        class_id=np.array([0, 2], np.int32),
        tracker_id=np.array([3, -1], np.int64),
    )
    head = wire.Result.of(FRAME, n=2)
    header, payload = wire.decode(wire.encode(head, wire.pack_detections(det)))
    assert isinstance(header, wire.Result)
    assert wire.unpack_detections(header.n, payload).equals(det)


def test_one_timing_from_frame_to_result_record() -> None:
    timing = wire.Timing(
        stream_id="cam-1", epoch=2, seq=7, pts=8_589_934_000, time_base=(1, 90_000),
        captured_at=1_700_000_000.25,
    )  # fmt: skip
    frame = wire.Frame.of(timing, src_w=1280, src_h=720, scale=0.325)
    assert frame == FRAME
    result = wire.Result.of(frame, n=0, timings={"infer_ms": 1.5})
    assert (result.n, result.timings) == (0, {"infer_ms": 1.5})
    record = ResultRecord.build(
        result, Detections.empty(), class_names=[], worker_id="w", received_at=1_700_000_001.0
    )
    for hop in (frame, result, record):
        assert {name: getattr(hop, name) for name in wire.TIMING_FIELDS} == timing.timing_fields()
    assert record.pts_time == timing.pts_time and record.latency_ms == 750.0
    assert wire.TIMING_FIELDS == ("stream_id", "epoch", "seq", "pts", "time_base", "captured_at")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "shorter than"),
        (b"\x02\x04\x00", "shorter than"),
        (raw(4, b"{}", version=1), "protocol version 1 on a tunnel that agreed on version 2"),
        (raw(4, b"{}", version=3), "protocol version 3 on a tunnel"),
        (raw(99, b"{}"), "unknown message type 99"),
        (struct.pack(">BBI", wire.VERSION, 4, 100) + b"{}", "truncated"),
        (raw(4, b"not json"), "invalid Frame header"),
        (raw(4, b"[1,2]"), "invalid Frame header"),
        (raw(4, b'{"stream_id":"a"}'), "missing required field `epoch`"),
        (raw(3, b'{"stream_id":"bad id with spaces"}'), "stream_id"),
        (raw(3, b'{"stream_id":"a/../b"}'), "stream_id"),
        (raw(3, b"\xff\xfe"), "invalid Close header"),
        (raw(4, _frame_json().replace("[1,90000]", "[0,90000]").encode()), "time_base"),
        (raw(4, _frame_json().replace('"seq":7', '"seq":-1').encode()), "seq"),
        (raw(4, _frame_json().replace('"seq":7', '"seq":"7"').encode()), "seq"),
    ],
)
def test_malformed_messages_raise_protocol_error(data: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        wire.decode(data)


def test_oversized_header_and_payload_are_refused_with_1009() -> None:
    limits = wire.Limits(max_header=64, max_payload=10)
    with pytest.raises(ProtocolError) as big_head:
        wire.decode(raw(4, b" " * 65), limits)
    assert big_head.value.close_code == wire.CloseCode.TOO_BIG
    with pytest.raises(ProtocolError) as big_payload:
        wire.decode(wire.encode(wire.Close(stream_id="a")) + b"x" * 11, limits)
    assert big_payload.value.close_code == wire.CloseCode.TOO_BIG
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.encode(FRAME, b"x" * 11, limits)


@pytest.mark.parametrize(("n", "payload_len"), [(1, 31), (1, 33), (0, 1), (2, 32)])
def test_detections_payload_size_must_match(n: int, payload_len: int) -> None:
    with pytest.raises(ProtocolError, match="expected"):
        wire.unpack_detections(n, b"\0" * payload_len)


def test_an_empty_result_unpacks_to_read_only_empty_detections() -> None:
    a, b = wire.unpack_detections(0, b""), wire.unpack_detections(0, b"")
    # array-likes of other dtypes on purpose: what construction makes of them is compared
    validated = Detections(xyxy=np.zeros((0, 4)), confidence=[], class_id=[], tracker_id=[])  # type: ignore[arg-type]
    assert a.equals(validated) and len(a) == 0 and a is b  # one immutable object
    for name in ("xyxy", "confidence", "class_id", "tracker_id"):
        got, want = getattr(a, name), getattr(validated, name)
        assert (got.shape, got.dtype) == (want.shape, want.dtype), name
        assert not got.flags.writeable, f"{name} is shared between results: read-only"
        with pytest.raises(ValueError, match="read-only"):
            got[...] = 0


def test_detections_with_nan_are_refused() -> None:
    payload = np.array([np.nan, 0, 1, 1], "<f4").tobytes() + b"\0" * 16
    with pytest.raises(ProtocolError, match="NaN"):
        wire.unpack_detections(1, payload)


def test_too_many_detections_refused_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="exceed the limit"):
        wire.unpack_detections(10_001, b"")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    try:
        wire.decode(data)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(wire.MsgType)),
    st.dictionaries(
        st.sampled_from(
            [
                "stream_id",
                "epoch",
                "seq",
                "pts",
                "time_base",
                "captured_at",
                "n",
                "code",
                "message",
                "src_w",
                "src_h",
                "scale",
                "timings",
                "worker_id",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(),
            st.floats(allow_nan=True),
            st.text(max_size=20),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(st.text(max_size=3), st.floats()),
        ),
        max_size=8,
    ),
    st.binary(max_size=64),
)
def test_structured_garbage_raises_only_protocol_error(
    mtype: int, header: dict[str, object], payload: bytes
) -> None:
    import json

    try:
        h, p = wire.decode(raw(int(mtype), json.dumps(header).encode(), payload))
        if isinstance(h, wire.Result):
            wire.unpack_detections(h.n, p)
    except ProtocolError:
        pass


def test_snapshot_and_resuming_open_round_trip() -> None:
    clock = wire.SessionClock(epoch=3, offset=1.5, last_t=12.25, last_captured=1_700_000_000.5)
    snap = wire.Snapshot(stream_id="cam-1", seq=41, clock=clock)
    header, payload = wire.decode(wire.encode(snap, b"FRTK..."))
    assert header == snap and payload == b"FRTK..."
    resume = wire.Open(stream_id="cam-1", tracker="default", clock=clock)
    header, payload = wire.decode(wire.encode(resume, b"blob"))
    assert isinstance(header, wire.Open) and header.clock == clock and payload == b"blob"
    plain, _ = wire.decode(wire.encode(wire.Open(stream_id="cam-1")))
    assert isinstance(plain, wire.Open) and plain.clock is None


def test_decode_view_gives_the_payload_without_copying_it() -> None:
    data = wire.encode(FRAME, b"\xff\xd8" + b"j" * 1000)
    header, view = wire.decode_view(data)
    assert header == wire.decode(data)[0] and view == wire.decode(data)[1]
    assert isinstance(view, memoryview) and view.obj is data
