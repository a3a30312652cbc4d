"""A stream moved to another worker keeps its track ids: the session snapshot
the first worker sent travels in the OPEN to the second one."""

from __future__ import annotations

import asyncio
import time

import av
import pytest
from websockets.asyncio.client import ClientConnection, connect

from framerelay import wire
from framerelay.protocol.negotiation import offer
from ingest.prepare import Preparer
from tests.conftest import CLIP
from tests.support.worker_harness import running_worker, token

pytestmark = pytest.mark.integration
SPLIT = 90


def frames() -> list[tuple[wire.Frame, bytes]]:
    prep = Preparer(416, 416)
    out = []
    with av.open(str(CLIP)) as c:
        tb = c.streams.video[0].time_base
        assert tb is not None
        for seq, f in enumerate(c.decode(video=0)):
            assert f.pts is not None
            p = prep.prepare(f)
            header = wire.Frame(
                stream_id="cam", epoch=0, seq=seq, pts=f.pts,
                time_base=(tb.numerator, tb.denominator), captured_at=time.time(),
                src_w=f.width, src_h=f.height, scale=p.letterbox.scale,
            )  # fmt: skip
            out.append((header, p.data))
    return out


async def _connect(url: str, secret: str, worker_id: str) -> ClientConnection:
    auth = {"Authorization": f"Bearer {token(secret, f'worker:{worker_id}')}"}
    ws = await connect(
        url, additional_headers=auth, compression=None, proxy=None, subprotocols=offer()
    )
    assert isinstance(wire.decode(await ws.recv(decode=False))[0], wire.Hello)
    return ws


async def _play(
    ws: ClientConnection,
    items: list[tuple[wire.Frame, bytes]],
    open_msg: bytes,
    final_snapshot: bool = True,
) -> tuple[list[list[int]], tuple[wire.SessionClock, bytes] | None]:
    """Send frames one at a time; returns track ids per frame and the last snapshot."""
    await ws.send(open_msg)
    ids: list[list[int]] = []
    snap = None
    for header, data in items:
        await ws.send(wire.encode(header, data))
        while True:
            h, p = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 30))
            if isinstance(h, wire.Snapshot):
                snap = (h.clock, p)
                continue
            assert isinstance(h, wire.Result), h
            ids.append(sorted(wire.unpack_detections(h.n, p).tracker_id.tolist()))
            break
    if final_snapshot:  # the snapshot taken after the last frame follows its result
        h, p = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 30))
        assert isinstance(h, wire.Snapshot), h
        snap = (h.clock, p)
    return ids, snap


async def test_track_ids_continue_on_another_worker(secret: str) -> None:
    items = frames()
    fresh = wire.encode(wire.Open(stream_id="cam"))

    every_frame = {"snapshot_interval_s": 1e-6}
    async with (
        running_worker(secret, "gpu-a", **every_frame) as (_, url_a),
        running_worker(secret, "gpu-b", **every_frame) as (worker_b, url_b),
    ):
        ws = await _connect(url_a, secret, "gpu-a")
        whole, _ = await _play(ws, items, fresh, False)
        await ws.close()
        ws = await _connect(url_a, secret, "gpu-a")
        await ws.send(wire.encode(wire.Close(stream_id="cam")))
        first, snap = await _play(
            ws, items[:SPLIT], wire.encode(wire.Open(stream_id="cam", tracker="default"))
        )
        await ws.close()  # worker A is gone as far as this stream is concerned
        assert snap is not None
        clock, blob = snap
        ws = await _connect(url_b, secret, "gpu-b")
        resumed_open = wire.encode(wire.Open(stream_id="cam", clock=clock), blob)
        second, _ = await _play(ws, items[SPLIT:], resumed_open)
        await ws.close()
        split, resumed = first + second, int(worker_b.metrics.resumed._value.get())

    assert resumed == 1
    assert any(ids and max(ids) > 0 for ids in whole[SPLIT:])
    assert split == whole  # identical ids before and after the move


async def test_garbage_snapshot_starts_a_fresh_session(secret: str) -> None:
    items = frames()[:5]

    async with running_worker(secret) as (_, url):
        ws = await _connect(url, secret, "gpu-a")
        await ws.send(
            wire.encode(wire.Open(stream_id="cam", clock=wire.SessionClock()), b"garbage!")
        )
        err, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
        assert isinstance(err, wire.Error)
        ids, _ = await _play(ws, items, wire.encode(wire.Open(stream_id="cam")), False)
        await ws.close()

    assert err.code == "bad_snapshot" and "starting a new session" in err.message
    assert len(ids) == 5
