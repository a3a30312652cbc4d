"""OPEN's optional ``tracker_settings`` (a stream's own tracker time settings)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
import pytest
from msgspec import Meta

from framerelay import wire
from framerelay.errors import ConfigError, ProtocolError
from framerelay.wire import TrackerTimes
from gpu_worker.sessions import new_session, resumed_session, time_overrides
from tests.framerelay import wire_golden as golden
from tests.support import wire_v1_peer as v1
from tracker import create_tracker

TIMES = TrackerTimes(max_lost_s=3.0, max_gap_s=20.0)


class _OldOpen(msgspec.Struct, frozen=True, kw_only=True):
    """OPEN as a v2 reader before ``tracker_settings`` decodes it."""

    stream_id: Annotated[str, Meta(min_length=1, max_length=128)]
    tracker: str = "default"
    clock: wire.SessionClock | None = None


def _head(data: bytes) -> dict[str, Any]:
    _, _, hlen = wire.PREFIX.unpack_from(data)
    out: dict[str, Any] = json.loads(data[wire.PREFIX.size : wire.PREFIX.size + hlen])
    return out


def test_round_trip_writes_only_the_settings_that_are_set() -> None:
    header = wire.Open(stream_id="cam-1", tracker_settings=TIMES)
    data = wire.encode(header)
    assert _head(data)["tracker_settings"] == {"max_lost_s": 3.0, "max_gap_s": 20.0}
    decoded, _ = wire.decode(data)
    assert decoded == header and isinstance(decoded, wire.Open) and decoded.times == TIMES


@pytest.mark.parametrize("name", ["open", "open_resume"])
def test_an_open_without_them_keeps_its_golden_bytes(name: str) -> None:
    header, payload = golden.message(name)
    assert isinstance(header, wire.Open) and header.times is None
    assert wire.encode(header, payload) == golden.golden(2, name)
    assert "tracker_settings" not in _head(golden.golden(2, name))


def test_a_reader_that_does_not_know_the_field_ignores_it() -> None:
    data = wire.encode(wire.Open(stream_id="cam-1", tracker="bytetrack", tracker_settings=TIMES))
    old = msgspec.json.decode(data[wire.PREFIX.size :], type=_OldOpen)
    assert old == _OldOpen(stream_id="cam-1", tracker="bytetrack")


def test_on_a_v1_tunnel_the_field_is_left_out_for_the_strict_v1_reader() -> None:
    header = wire.Open(stream_id="cam-1", tracker_settings=TIMES)
    data = wire.encode(header, version=1)
    assert data == golden.golden(1, "open")
    assert v1.decode(data)[0] == v1.decode(golden.golden(1, "open"))[0]


@pytest.mark.parametrize("value", ["-1.0", "3601", "NaN", "Infinity", "1e400", '"x"', "true"])
def test_bad_values_from_a_peer_are_refused(value: str) -> None:
    head = b'{"stream_id":"cam-1","tracker_settings":{"max_lost_s":' + value.encode() + b"}}"
    data = wire.PREFIX.pack(2, wire.MsgType.OPEN, len(head)) + head
    with pytest.raises(ProtocolError, match="tracker_settings"):
        wire.decode(data)


def test_unknown_names_inside_are_ignored_by_readers_and_refused_when_built() -> None:
    raw = _head(wire.encode(wire.Open(stream_id="cam-1", tracker_settings=TIMES)))
    raw["tracker_settings"]["added_later_s"] = 1.0
    head = json.dumps(raw).encode()
    decoded, _ = wire.decode(wire.PREFIX.pack(2, wire.MsgType.OPEN, len(head)) + head)
    assert isinstance(decoded, wire.Open) and decoded.times == TIMES
    with pytest.raises(TypeError, match="typo_s"):
        TrackerTimes(typo_s=1.0)  # type: ignore[call-arg]


def test_sessions_apply_them_to_new_and_resumed_trackers() -> None:
    assert time_overrides(TIMES) == {"max_lost_s": 3.0, "max_gap_s": 20.0}
    session = new_session("cam-1", "default", 0.25, 0.0, TIMES)
    assert session.tracker.settings.max_lost_s == 3.0  # type: ignore[attr-defined]
    blob = create_tracker("default").snapshot()
    resumed = resumed_session("cam-1", blob, wire.SessionClock(), 0.25, 0.0, TIMES)
    assert resumed.tracker.settings.max_gap_s == 20.0  # type: ignore[attr-defined]


def test_sessions_refuse_settings_the_tracker_does_not_take() -> None:
    with pytest.raises(ConfigError, match="no time settings"):
        new_session("cam-1", "none", 0.25, 0.0, TIMES)
    with pytest.raises(ConfigError, match="max_gap_s"):
        new_session("cam-1", "default", 0.25, 0.0, TrackerTimes(max_gap_s=61.0))
