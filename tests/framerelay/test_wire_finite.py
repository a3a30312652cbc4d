"""Issue 11: every number on the wire is finite and in range.

NaN, +-Infinity (JSON ``NaN``/``Infinity`` or an overflowing ``1e400``) and
out-of-range values in every numeric field of every message are refused with
a ProtocolError; for a FRAME that still names a valid stream and seq it is a
:class:`wire.FrameError` carrying both, so the worker answers that frame only.
Valid messages keep their exact bytes: see test_wire_golden.py.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest

from framerelay import wire
from framerelay.errors import ProtocolError

TIMING = {"stream_id": "cam-1", "epoch": 2, "seq": 7, "pts": 8_589_934_000,
          "time_base": [1, 90_000], "captured_at": 1_700_000_000.25}  # fmt: skip
CLOCK = {"epoch": 3, "offset": 1.5, "last_t": 12.25, "last_captured": 1_700_000_000.5}
VALID: dict[wire.MsgType, dict[str, Any]] = {
    wire.MsgType.HELLO: {"worker_id": "w", "input_w": 416, "input_h": 416, "class_names": ["a"],
                         "providers": ["CPU"], "max_inflight": 4, "features": ["resume"]},
    wire.MsgType.FRAME: {**TIMING, "encoding": "jpeg", "src_w": 1280, "src_h": 720,
                         "scale": 0.325},
    wire.MsgType.RESULT: {**TIMING, "n": 0, "timings": {"infer_ms": 3.5}},
    wire.MsgType.OPEN: {"stream_id": "cam-1", "tracker": "default", "clock": CLOCK},
    wire.MsgType.SNAPSHOT: {"stream_id": "cam-1", "seq": 41, "clock": CLOCK},
    wire.MsgType.ERROR: {"code": "x", "message": "y", "stream_id": "cam-1", "seq": 3},
}  # fmt: skip
NUMERIC: dict[wire.MsgType, list[str]] = {
    wire.MsgType.HELLO: ["input_w", "input_h", "max_inflight"],
    wire.MsgType.FRAME: ["epoch", "seq", "pts", "time_base.0", "time_base.1", "captured_at",
                         "src_w", "src_h", "scale"],
    wire.MsgType.RESULT: ["epoch", "seq", "pts", "time_base.0", "time_base.1", "captured_at",
                          "n", "timings.infer_ms"],
    wire.MsgType.OPEN: ["clock.epoch", "clock.offset", "clock.last_t", "clock.last_captured"],
    wire.MsgType.SNAPSHOT: ["seq", "clock.epoch", "clock.offset", "clock.last_t",
                            "clock.last_captured"],
    wire.MsgType.ERROR: ["seq"],
}  # fmt: skip
BAD_TOKENS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e300", "-1e300",
              str(2**64), str(-(2**64))]  # fmt: skip
"""Raw JSON tokens; 1e300 and 2**64 are finite but out of every field's range."""
WIDE = {"clock.offset", "clock.last_t"}
"""Session-clock seconds reach about 1e28 (PTS times): 2**64 is in range there."""
CASES = [
    (t, f, tok)
    for t, fields in NUMERIC.items()
    for f in fields
    for tok in BAD_TOKENS
    if not (f in WIDE and tok.lstrip("-").isdigit())
]


def _message(mtype: wire.MsgType, path: str, token: str) -> bytes:
    """The valid header of ``mtype`` with the field at ``path`` set to the raw ``token``."""
    header = json.loads(json.dumps(VALID[mtype]))
    *parents, last = path.split(".")
    node: Any = header
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if last.isdigit():
        node[int(last)] = "@@"
    else:
        node[last] = "@@"
    raw = json.dumps(header, separators=(",", ":")).replace('"@@"', token).encode()
    return struct.pack(">BBI", wire.VERSION, mtype, len(raw)) + raw


@pytest.mark.parametrize("mtype", list(VALID))
def test_the_valid_headers_decode(mtype: wire.MsgType) -> None:
    raw = json.dumps(VALID[mtype]).encode()
    header, _ = wire.decode(struct.pack(">BBI", wire.VERSION, mtype, len(raw)) + raw)
    assert header.TYPE == mtype


@pytest.mark.parametrize(("mtype", "path", "token"), CASES)
def test_non_finite_and_out_of_range_numbers_are_refused(
    mtype: wire.MsgType, path: str, token: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        wire.decode(_message(mtype, path, token))
    err = caught.value
    if mtype == wire.MsgType.FRAME and path != "seq":
        assert isinstance(err, wire.FrameError), f"{path}={token}: no per-frame error"
        assert (err.stream_id, err.seq) == ("cam-1", 7)
        assert err.close_code == wire.CloseCode.PROTOCOL
    else:
        assert not isinstance(err, wire.FrameError)


@pytest.mark.parametrize(
    ("update", "per_frame"),
    [
        ({"seq": -1}, False),
        ({"seq": 2**63}, False),
        ({"seq": "7"}, False),
        ({"seq": True}, False),
        ({"stream_id": "bad id"}, False),
        ({"stream_id": "ok\n"}, False),
        ({"stream_id": 5}, False),
        ({"captured_at": -1.0}, True),
        ({"captured_at": 1e11}, True),
        ({"scale": 0.0}, True),
        ({"scale": 65.0}, True),
        ({"time_base": [0, 1]}, True),
        ({"time_base": [1, 2**32]}, True),
    ],
)
def test_frame_errors_name_the_frame_only_when_it_is_readable(
    update: dict[str, Any], per_frame: bool
) -> None:
    raw = json.dumps({**VALID[wire.MsgType.FRAME], **update}).encode()
    with pytest.raises(ProtocolError) as caught:
        wire.decode(struct.pack(">BBI", wire.VERSION, wire.MsgType.FRAME, len(raw)) + raw)
    assert isinstance(caught.value, wire.FrameError) is per_frame
    if per_frame:
        frame_err = caught.value
        assert isinstance(frame_err, wire.FrameError)
        assert (frame_err.stream_id, frame_err.seq) == ("cam-1", 7)


def test_a_frame_that_is_not_json_or_not_an_object_closes_the_tunnel() -> None:
    for raw in (b"{oops", b"[1,2]", b'"cam-1"', b"\xff\xfe", b"[" * 5000 + b"]" * 5000):
        data = struct.pack(">BBI", wire.VERSION, wire.MsgType.FRAME, len(raw)) + raw
        with pytest.raises(ProtocolError) as caught:
            wire.decode(data)
        assert not isinstance(caught.value, wire.FrameError)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300])
@pytest.mark.parametrize("field", ["captured_at", "scale"])
def test_a_sender_cannot_build_a_non_finite_frame(field: str, value: float) -> None:
    fields = {**VALID[wire.MsgType.FRAME], "time_base": (1, 90_000), field: value}
    with pytest.raises(wire.InvalidMessage, match=field):
        wire.build(wire.Frame, **fields)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e31, -1e31])
@pytest.mark.parametrize("field", ["offset", "last_t", "last_captured"])
def test_session_clocks_are_finite_and_bounded(field: str, value: float) -> None:
    with pytest.raises(wire.InvalidMessage, match=field):
        wire.build(wire.SessionClock, **{field: value})


def test_result_timings_must_be_finite() -> None:
    fields = {**TIMING, "time_base": (1, 90_000), "n": 0}
    for bad in (math.nan, math.inf, 1e13):
        with pytest.raises(wire.InvalidMessage, match="timings"):
            wire.build(wire.Result, **fields, timings={"infer_ms": bad})


@pytest.mark.parametrize("mtype", [wire.MsgType.FRAME, wire.MsgType.CLOSE])
def test_deep_nesting_in_an_unknown_field_is_a_protocol_error(mtype: wire.MsgType) -> None:
    """msgspec skips an unknown field's value recursively: 16 KB of ``[`` must not escape
    as a RecursionError (found when the codec moved from pydantic to msgspec)."""
    depth = 8000
    head = {**VALID.get(mtype, {"stream_id": "cam-1"})}
    raw = json.dumps(head).encode()[:-1] + b', "pad": ' + b"[" * depth + b"]" * depth + b"}"
    data = struct.pack(">BBI", wire.VERSION, mtype, len(raw)) + raw
    with pytest.raises(ProtocolError, match="nested too deeply"):
        wire.decode(data, wire.Limits(max_header=len(raw)))


def test_timing_fields_are_the_timing_fields() -> None:
    frame = wire.build(wire.Frame, **{**VALID[wire.MsgType.FRAME], "time_base": (1, 90_000)})
    assert tuple(frame.timing_fields()) == wire.TIMING_FIELDS
    assert wire.Result.of(frame, n=0).timing_fields() == frame.timing_fields()
