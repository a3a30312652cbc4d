"""Golden bytes: every message type, in every supported version, byte for byte.

The fixtures (``fixtures/wire/v<N>/*.bin``) are checked in; see
:mod:`tests.framerelay.wire_golden` for how to regenerate them on purpose.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from framerelay import wire
from framerelay.errors import ProtocolError
from tests.framerelay import wire_golden as golden
from tests.support import wire_v1_peer as v1

NAMES = sorted(golden.FIELDS)


def test_every_message_type_has_a_golden_message() -> None:
    covered = {mtype for mtype, _, _ in golden.FIELDS.values()}
    assert covered == set(wire.MsgType)


@pytest.mark.parametrize("name", NAMES)
def test_v2_encodes_to_the_golden_bytes_and_back(name: str) -> None:
    header, payload = golden.message(name)
    data = golden.golden(2, name)
    assert data[0] == 2 == wire.VERSION
    assert wire.encode(header, payload) == data
    assert wire.decode(data) == (header, payload)


@pytest.mark.parametrize("name", NAMES)
def test_what_a_v1_peer_wrote_decodes_on_a_v1_tunnel(name: str) -> None:
    header, payload = golden.message(name)
    if isinstance(header, wire.Hello):  # a v1 HELLO names no features
        header = msgspec.structs.replace(header, features=[])
    data = golden.golden(1, name)
    assert data[0] == 1
    assert golden.v1_bytes(name) == data  # the v1 codec still writes what is checked in
    assert wire.decode(data, version=1) == (header, payload)


@pytest.mark.parametrize("name", NAMES)
def test_what_this_code_writes_on_a_v1_tunnel_is_what_a_v1_peer_reads(name: str) -> None:
    header, payload = golden.message(name)
    ours = wire.encode(header, payload, version=1)
    theirs = golden.golden(1, name)
    assert v1.decode(ours) == v1.decode(theirs)  # the strict v1 reader takes it
    if name != "frame":  # v1 wrote pad_x/pad_y (always 0, its defaults); v2 dropped them
        assert ours == theirs


@pytest.mark.parametrize("version", [1, 2])
def test_a_message_of_the_other_version_is_refused(version: int) -> None:
    other = 3 - version
    with pytest.raises(ProtocolError, match=f"version {other} on a tunnel"):
        wire.decode(golden.golden(other, "close"), version=version)


def _with_field(data: bytes, field: str, value: object) -> bytes:
    """``data`` (one message) with one more header field."""
    _, mtype, hlen = wire.PREFIX.unpack_from(data)
    head: dict[str, Any] = json.loads(data[wire.PREFIX.size : wire.PREFIX.size + hlen])
    head[field] = value
    raw = json.dumps(head).encode()
    return wire.PREFIX.pack(data[0], mtype, len(raw)) + raw + data[wire.PREFIX.size + hlen :]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_readers_ignore_fields_they_do_not_know(version: int, name: str) -> None:
    data = golden.golden(version, name)
    expected = wire.decode(data, version=version)
    newer = _with_field(data, "added_in_a_later_minor", {"any": ["thing", 1.5]})
    assert wire.decode(newer, version=version) == expected


def test_nested_unknown_fields_are_ignored_too() -> None:
    data = golden.golden(2, "snapshot")
    _, mtype, hlen = wire.PREFIX.unpack_from(data)
    head = json.loads(data[6 : 6 + hlen])
    head["clock"]["drift"] = 0.25
    raw = json.dumps(head).encode()
    header, _ = wire.decode(wire.PREFIX.pack(2, mtype, len(raw)) + raw + data[6 + hlen :])
    assert header == golden.message("snapshot")[0]


@pytest.mark.parametrize("name", NAMES)
def test_messages_built_in_code_stay_strict(name: str) -> None:
    mtype, fields, _ = golden.FIELDS[name]
    with pytest.raises(TypeError, match="typo_field"):
        wire._BY_TYPE[mtype](**fields, typo_field=1)
    with pytest.raises(wire.InvalidMessage, match="no field typo_field"):
        wire.build(wire._BY_TYPE[mtype], **fields, typo_field=1)


def test_an_unknown_field_with_a_bad_value_is_still_ignored() -> None:
    data = _with_field(golden.golden(2, "frame"), "pad_x", "not a number")
    header, _ = wire.decode(data)
    assert header == golden.message("frame")[0]


def test_the_fixture_files_are_what_the_generator_writes() -> None:
    for path, data in golden.generate().items():
        assert path.read_bytes() == data, f"{path} differs: regenerate on purpose, see the doc"


def test_v1_hello_keeps_v1s_shape() -> None:
    hello, _ = golden.message("hello")
    data = wire.encode(hello, version=1)
    head = json.loads(data[6:])
    assert "features" not in head and head["encodings"] == ["jpeg"]
    with pytest.raises(ValueError, match="not one of"):
        wire.encode(hello, version=7)
