"""Stream ids on the wire: the pattern is checked once per new id, then remembered.

Issue 12's tunnel benchmark: msgspec's ``pattern`` constraint cost about 0.5 us per
header, as much as decoding the rest of it; the check now runs after msgspec and
remembers the ids that matched. These tests pin that nothing got through because of it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import msgspec
import pytest

from framerelay import stream_ids, wire
from framerelay.errors import ProtocolError

BAD = ["", "a b", "a/../b", "-leading-dash", "a\n", "é", "x" * 129, "a\x00"]


@pytest.fixture(autouse=True)
def fresh_memory() -> Iterator[None]:
    stream_ids.KNOWN.clear()
    yield
    stream_ids.KNOWN.clear()


def raw(mtype: int, header: dict[str, object]) -> bytes:
    head = msgspec.json.encode(header)
    return struct.pack(">BBI", wire.VERSION, mtype, len(head)) + head


TIMING = {"epoch": 0, "seq": 1, "pts": 0, "time_base": [1, 90_000], "captured_at": 1.0}
HEADERS: dict[str, tuple[int, dict[str, object]]] = {
    "Open": (wire.MsgType.OPEN, {}),
    "Close": (wire.MsgType.CLOSE, {}),
    "Frame": (wire.MsgType.FRAME, {**TIMING, "src_w": 4, "src_h": 4, "scale": 1.0}),
    "Result": (wire.MsgType.RESULT, {**TIMING, "n": 0}),
    "Snapshot": (wire.MsgType.SNAPSHOT, {"seq": 1, "clock": {}}),
    "Error": (wire.MsgType.ERROR, {"code": "x", "message": "y", "seq": 1}),
}


@pytest.mark.parametrize("sid", BAD)
def test_a_bad_id_is_refused_and_never_remembered(sid: str) -> None:
    assert not stream_ids.is_valid(sid)
    assert not stream_ids.is_valid(sid)  # the second time too
    assert sid not in stream_ids.KNOWN


@pytest.mark.parametrize("name", sorted(HEADERS))
@pytest.mark.parametrize("sid", BAD)
def test_every_header_naming_a_stream_refuses_a_bad_id(name: str, sid: str) -> None:
    mtype, fields = HEADERS[name]
    data = raw(mtype, {**fields, "stream_id": sid})
    with pytest.raises(ProtocolError, match="stream_id") as info:
        wire.decode(data)
    # a FRAME with a bad id cannot be answered alone: its id cannot go back in an ERROR
    assert not isinstance(info.value, wire.FrameError)
    with pytest.raises(wire.InvalidMessage, match="stream_id"):
        wire.build(wire.Close, stream_id=sid)


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_a_good_id_decodes_before_and_after_it_is_remembered(name: str) -> None:
    mtype, fields = HEADERS[name]
    data = raw(mtype, {**fields, "stream_id": "cam-1.a:b_c"})
    for _ in range(2):
        header, _ = wire.decode(data)
        assert getattr(header, "stream_id") == "cam-1.a:b_c"  # noqa: B009 - a Header union
    assert "cam-1.a:b_c" in stream_ids.KNOWN


def test_the_error_names_the_field_and_shows_a_bounded_value() -> None:
    with pytest.raises(ProtocolError) as info:
        wire.decode(raw(wire.MsgType.CLOSE, {"stream_id": "bad id " + "z" * 100}))
    text = str(info.value)
    assert text.startswith("invalid Close header: stream_id: expected 1-128 letters"), text
    assert "'bad id zzz" in text and "z" * 60 not in text, text


def test_the_memory_is_bounded_whatever_a_peer_sends() -> None:
    for i in range(3 * stream_ids.KNOWN_MAX):
        assert stream_ids.is_valid(f"cam-{i}")
        assert len(stream_ids.KNOWN) <= stream_ids.KNOWN_MAX
    assert stream_ids.is_valid("cam-0")  # forgotten, checked again, still good
