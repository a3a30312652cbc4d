"""The optional model fields within version 2: OPEN's ``model``, RESULT's ``model`` and
HELLO's ``models`` (a feature, ``models``, says a worker understands them)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
import pytest
from msgspec import Meta

from framerelay import wire
from framerelay.credits import CreditWindow
from framerelay.errors import ConfigError, ProtocolError
from framerelay.protocol import IngestProtocol
from framerelay.protocol import negotiation as versions
from tests.framerelay import wire_golden as golden
from tests.support import wire_v1_peer as v1

VEHICLES = wire.ModelInfo(name="vehicles", input_w=416, input_h=416,
                          class_names=["car", "bus", "truck"])  # fmt: skip


class _OldOpen(msgspec.Struct, frozen=True, kw_only=True):
    """OPEN as a v2 reader before ``model`` decodes it."""

    stream_id: Annotated[str, Meta(min_length=1, max_length=128)]
    tracker: str = "default"
    clock: wire.SessionClock | None = None


def _head(data: bytes) -> dict[str, Any]:
    _, _, hlen = wire.PREFIX.unpack_from(data)
    out: dict[str, Any] = json.loads(data[wire.PREFIX.size : wire.PREFIX.size + hlen])
    return out


def _raw(mtype: wire.MsgType, head: dict[str, Any], version: int = 2) -> bytes:
    body = json.dumps(head).encode()
    return wire.PREFIX.pack(version, mtype, len(body)) + body


def test_open_round_trip_and_an_older_reader_ignores_it() -> None:
    data = wire.encode(wire.Open(stream_id="cam-1", model="vehicles"))
    assert _head(data)["model"] == "vehicles"
    decoded, _ = wire.decode(data)
    assert isinstance(decoded, wire.Open) and decoded.model_name == "vehicles"
    old = msgspec.json.decode(data[wire.PREFIX.size :], type=_OldOpen)
    assert old == _OldOpen(stream_id="cam-1")


@pytest.mark.parametrize("name", ["open", "open_resume", "hello", "result"])
def test_messages_without_them_keep_their_golden_bytes(name: str) -> None:
    header, payload = golden.message(name)
    assert wire.encode(header, payload) == golden.golden(2, name)
    assert "model" not in _head(golden.golden(2, name))
    assert "models" not in _head(golden.golden(2, name))


def test_on_a_v1_tunnel_they_are_left_out_for_the_strict_v1_reader() -> None:
    open_ = wire.Open(stream_id="cam-1", model="vehicles")
    assert wire.encode(open_, version=1) == golden.golden(1, "open")
    header, payload = golden.message("result")
    assert isinstance(header, wire.Result)
    named = msgspec.structs.replace(header, model="vehicles")
    assert wire.encode(named, payload, version=1) == golden.golden(1, "result")
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    listed = msgspec.structs.replace(hello, models=[VEHICLES])
    assert v1.decode(wire.encode(listed, version=1))[0] == v1.decode(golden.golden(1, "hello"))[0]


def test_result_of_carries_the_model_name() -> None:
    header, _ = golden.message("result")
    assert isinstance(header, wire.Result)
    result = wire.Result.of(header, n=2, model="vehicles")
    decoded, _ = wire.decode(wire.encode(result, wire.pack_detections(golden.DETECTIONS)))
    assert isinstance(decoded, wire.Result) and decoded.model_name == "vehicles"
    assert wire.Result.of(header, n=2).model_name is None


def test_hello_lists_models_and_names_their_classes() -> None:
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    listed = msgspec.structs.replace(hello, models=[VEHICLES])
    decoded, _ = wire.decode(wire.encode(listed))
    assert isinstance(decoded, wire.Hello) and decoded.model("vehicles") == VEHICLES
    assert decoded.class_names_of("vehicles") == ["car", "bus", "truck"]
    assert decoded.class_names_of(None) == hello.class_names
    assert decoded.class_names_of("unknown") == []  # named by number, never by another model


@pytest.mark.parametrize("value", ['""', '"' + "x" * 65 + '"', "3", "null"])
def test_bad_model_names_from_a_peer_are_refused(value: str) -> None:
    head = b'{"stream_id":"cam-1","model":' + value.encode() + b"}"
    with pytest.raises(ProtocolError, match="model"):
        wire.decode(wire.PREFIX.pack(2, wire.MsgType.OPEN, len(head)) + head)


def _ingest(features: list[str], version: int = 2) -> IngestProtocol:
    proto = IngestProtocol(version)
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    hello = msgspec.structs.replace(hello, features=features)
    proto.receive_data(wire.encode(hello, version=version), 0.0)
    return proto


def test_ingest_names_the_model_only_to_a_worker_with_the_feature() -> None:
    proto = _ingest(list(versions.FEATURES))
    data = proto.open_stream("cam-1", CreditWindow(cap=2), model="vehicles")
    assert _head(data)["model"] == "vehicles"
    assert "model" not in _head(proto.open_stream("cam-2", CreditWindow(cap=2)))
    old = _ingest([versions.RESUME, versions.SNAPSHOTS])
    with pytest.raises(ConfigError, match="serves only its one model"):
        old.open_stream("cam-1", CreditWindow(cap=2), model="vehicles")
    assert not versions.has_feature(golden.message("hello")[0], 1, versions.MODELS)  # type: ignore[arg-type]
