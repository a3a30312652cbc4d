"""``probe_failure``: one rule for the canary and the round-trip probe (both one-stream
probes over a tunnel) about which events end them, and how the reason reads."""

from __future__ import annotations

from framerelay import wire
from framerelay.errors import ProtocolError
from framerelay.protocol import (
    FrameFailed,
    IngestEvent,
    PeerError,
    ProtocolViolation,
    SnapshotReceived,
    probe_failure,
)


def test_a_failed_frame_a_refused_open_and_a_violation_end_a_probe() -> None:
    refused = wire.Error(code="unknown_model", message="no model 'x'", stream_id="probe")
    violation = ProtocolViolation(ProtocolError("bad header"), 1002, "bad header")
    assert probe_failure(FrameFailed("probe", 3, "decode_failed", "not a JPEG")) == (
        "the worker answered the frame with decode_failed"
    )
    assert probe_failure(PeerError(refused)) == (
        "the worker refused the stream: unknown_model: no model 'x'"
    )
    assert probe_failure(violation) == "protocol error: bad header"


def test_other_events_do_not() -> None:
    tunnel_error = wire.Error(code="overloaded", message="busy")  # about no stream's OPEN
    events: list[IngestEvent] = [
        PeerError(tunnel_error),
        SnapshotReceived("probe", 1, wire.SessionClock(), b"blob"),
    ]
    assert [probe_failure(e) for e in events] == [None, None]
