"""Version negotiation and whole conversations between the two protocol objects, in memory.

A v2 peer against a v2 peer, a v1 peer (the v1 codec as released, strict)
against this code on either side, and peers with no common version.
"""

from __future__ import annotations

import msgspec
import pytest

from framerelay import wire
from framerelay.credits import CreditWindow
from framerelay.protocol import (
    FrameReceived,
    HelloReceived,
    IngestProtocol,
    NoCommonVersion,
    ResultReceived,
    SnapshotReceived,
    StreamClosed,
    StreamOpened,
    WorkerProtocol,
)
from framerelay.protocol import negotiation as versions
from tests.framerelay import wire_golden as golden
from tests.support import wire_v1_peer as v1

V2, V1 = "framerelay.v2", "framerelay.v1"


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        ([V2, V1], 2),
        ([V1, V2], 2),  # the worker prefers the newest, whatever the order
        ([V1], 1),
        ([], 1),  # a peer from before negotiation
        (["chat", V2, "framerelay.v9"], 2),
        (["framerelay.v02", V1], 1),  # not a version name: ignored
    ],
)
def test_the_worker_chooses_the_newest_common_version(offered: list[str], chosen: int) -> None:
    assert versions.select(offered) == chosen


@pytest.mark.parametrize(
    ("offered", "supported", "needle"),
    [
        (["framerelay.v9"], (2, 1), "the peer offered framerelay.v9"),
        (["chat"], (2, 1), "the peer offered chat"),
        ([], (2,), "the peer offered none (v1)"),
        ([V1], (2,), "this worker speaks framerelay.v2; the peer offered framerelay.v1"),
        ([f"framerelay.v{n}" for n in range(10, 60)], (2, 1), "framerelay.v10, "),
    ],
)
def test_no_common_version_is_refused_with_a_clear_reason(
    offered: list[str], supported: tuple[int, ...], needle: str
) -> None:
    with pytest.raises(NoCommonVersion) as refused:
        versions.select(offered, supported)
    reason = str(refused.value)
    assert reason.startswith("no common tunnel version") and needle in reason
    assert len(reason.encode()) <= 123 and refused.value.close_code == 1002


@pytest.mark.parametrize(
    ("chosen", "version"), [(V2, 2), (V1, 1), (None, 1)]
)  # None: a worker from before negotiation
def test_the_ingest_accepts_the_workers_choice(chosen: str | None, version: int) -> None:
    assert versions.accepted(chosen) == version


@pytest.mark.parametrize(("chosen", "supported"), [("framerelay.v3", (2, 1)), (None, (2,))])
def test_the_ingest_refuses_a_version_it_does_not_speak(
    chosen: str | None, supported: tuple[int, ...]
) -> None:
    with pytest.raises(NoCommonVersion, match="this ingest speaks"):
        versions.accepted(chosen, supported)


def test_offer_is_newest_first_and_names_map_back() -> None:
    assert versions.offer() == [V2, V1]
    assert [versions.version_of(n) for n in (V2, V1, "framerelay.v", "x", None)] == [
        2, 1, None, None, None,
    ]  # fmt: skip


def test_features_of_a_v1_worker_are_implied() -> None:
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    bare = msgspec.structs.replace(hello, features=[])
    assert versions.has_feature(bare, 1, versions.RESUME)
    assert not versions.has_feature(bare, 2, versions.RESUME)
    assert versions.has_feature(hello, 2, versions.RESUME)


# -- whole conversations -------------------------------------------------------------


def _hello() -> wire.Hello:
    hello, _ = golden.message("hello")
    assert isinstance(hello, wire.Hello)
    return hello


@pytest.mark.parametrize("version", [2, 1])
def test_a_conversation_between_the_two_sides(version: int) -> None:
    ingest = IngestProtocol(version)
    worker = WorkerProtocol(version, max_streams=4, max_inflight=2)
    [hello] = ingest.receive_data(worker.send_hello(_hello()), 0.0)
    assert isinstance(hello, HelloReceived) and hello.hello.worker_id == "gpu-a"
    window = CreditWindow(cap=2, limit=2)
    [opened] = worker.receive_data(ingest.open_stream("cam-1", window))
    assert isinstance(opened, StreamOpened) and not opened.reopened
    frame, payload = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    [got] = worker.receive_data(ingest.send_frame(frame, payload, 1.0))
    assert isinstance(got, FrameReceived) and got.frame == frame and got.payload == payload
    result, detections = golden.message("result")
    snapshot, blob = golden.message("snapshot")
    assert isinstance(result, wire.Result) and isinstance(snapshot, wire.Snapshot)
    [answer] = ingest.receive_data(worker.send_result(result, detections), 1.5)
    assert isinstance(answer, ResultReceived) and answer.rtt_s == pytest.approx(0.5)
    [snap] = ingest.receive_data(worker.send_snapshot(snapshot, blob), 1.5)
    assert isinstance(snap, SnapshotReceived) and ingest.snapshots["cam-1"][1] == blob
    assert window.inflight == {} and worker.inflight("cam-1") == 0
    [closed] = worker.receive_data(ingest.close_stream("cam-1"))
    assert closed == StreamClosed("cam-1", True)


def test_a_v1_ingest_against_this_worker() -> None:
    """A v1 ingest sends no subprotocol: the worker speaks v1, which its strict reader takes."""
    worker = WorkerProtocol(versions.select([]), max_streams=4, max_inflight=2)
    hello, _ = v1.decode(worker.send_hello(_hello()))
    assert isinstance(hello, v1.Hello) and hello.encodings == ["jpeg"]
    assert isinstance(worker.receive_data(v1.encode(v1.Open(stream_id="cam-1")))[0], StreamOpened)
    frame = v1.Frame(**golden.FIELDS["frame"][1])
    [got] = worker.receive_data(v1.encode(frame, b"\xff\xd8"))
    assert isinstance(got, FrameReceived) and got.frame.seq == 7
    result, payload = golden.message("result")
    assert isinstance(result, wire.Result)
    header, data = v1.decode(worker.send_result(result, payload))
    assert isinstance(header, v1.Result) and v1.unpack_detections(header.n, data).equals(
        golden.DETECTIONS
    )
    error, _ = v1.decode(worker.send_error("capacity", "worker queue is full", "cam-1", 8))
    assert isinstance(error, v1.Error) and error.seq == 8


def test_this_ingest_against_a_v1_worker() -> None:
    """A v1 worker chooses no subprotocol: the ingest reads v1, features implied."""
    ingest = IngestProtocol(versions.accepted(None))
    v1_hello = v1.Hello(**golden.HELLO, encodings=["jpeg"])
    [hello] = ingest.receive_data(v1.encode(v1_hello), 0.0)
    assert isinstance(hello, HelloReceived) and hello.hello.features == []
    opened, _ = v1.decode(ingest.open_stream("cam-1", CreditWindow()))
    assert isinstance(opened, v1.Open)
    frame, payload = golden.message("frame")
    assert isinstance(frame, wire.Frame)
    sent, _ = v1.decode(ingest.send_frame(frame, payload, 0.0))
    assert isinstance(sent, v1.Frame) and (sent.pad_x, sent.pad_y) == (0, 0)
    [answer] = ingest.receive_data(golden.golden(1, "result"), 0.1)
    assert isinstance(answer, ResultReceived) and answer.detections.equals(golden.DETECTIONS)
