"""Peers of other versions against a real worker (in-process, real loopback socket).

* an ingest whose OPEN and FRAME carry a field this worker does not know (a
  newer minor version) gets its results;
* a v1 ingest (no subprotocol, the v1 codec as released, strict reader) is
  served v1: HELLO and RESULT decode in its reader;
* an ingest offering only versions this worker does not speak is refused with
  close code 1002 and a reason that names both sides' versions.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from framerelay import wire
from framerelay.protocol.negotiation import offer
from tests.conftest import TIMEOUT_FACTOR
from tests.gpu_worker.tunnel_rig import JPEG, SIDE, frame
from tests.support import wire_v1_peer as v1
from tests.support.worker_harness import running_worker, token

WAIT_S = 30 * TIMEOUT_FACTOR


def _with_extra(data: bytes, **extra: object) -> bytes:
    """One v2 message with more header fields."""
    _, mtype, hlen = wire.PREFIX.unpack_from(data)
    head: dict[str, Any] = {**json.loads(data[6 : 6 + hlen]), **extra}
    raw = json.dumps(head).encode()
    return wire.PREFIX.pack(data[0], mtype, len(raw)) + raw + data[6 + hlen :]


async def _connect(
    url: str, secret: str, subprotocols: list[Subprotocol] | None
) -> ClientConnection:
    return await connect(url, additional_headers={"Authorization": f"Bearer {token(secret)}"},
                         compression=None, proxy=None, max_size=None,
                         subprotocols=subprotocols)  # fmt: skip


async def _next(ws: ClientConnection, version: int = wire.VERSION) -> wire.Header:
    header, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), WAIT_S), version=version)
    return header


async def test_a_newer_ingest_with_extra_fields_in_open_and_frame_gets_results(secret: str) -> None:
    async with running_worker(secret) as (_, url):
        ws = await _connect(url, secret, offer())
        try:
            assert isinstance(await _next(ws), wire.Hello)
            opened = wire.encode(wire.Open(stream_id="cam"))
            await ws.send(_with_extra(opened, priority="high", hints={"zone": 3}))
            data = wire.encode(frame("cam", 0), JPEG)
            await ws.send(_with_extra(data, roi=[0, 0, SIDE, SIDE], colorspace="bt709"))
            chosen, answer = ws.subprotocol, await _next(ws)
        finally:
            await ws.close()
    assert chosen == "framerelay.v2"
    assert isinstance(answer, wire.Result) and (answer.stream_id, answer.seq) == ("cam", 0)


async def test_a_v1_ingest_is_served_v1(secret: str) -> None:
    async with running_worker(secret) as (_, url):
        ws = await _connect(url, secret, None)  # a v1 ingest offers no subprotocol
        try:
            seen: list[object] = [v1.decode(await ws.recv(decode=False))[0]]
            await ws.send(v1.encode(v1.Open(stream_id="old")))
            f = frame("old", 0)
            old = v1.Frame(**msgspec.structs.asdict(f), pad_x=0, pad_y=0)
            await ws.send(v1.encode(old, JPEG))
            data = await asyncio.wait_for(ws.recv(decode=False), WAIT_S)
            seen.append(v1.decode(data)[0])  # the strict v1 reader
            chosen = ws.subprotocol
            hello, result = seen
        finally:
            await ws.close()
    assert chosen is None
    assert isinstance(hello, v1.Hello) and hello.encodings == ["jpeg"]
    assert isinstance(result, v1.Result) and result.stream_id == "old"


async def test_a_v1_ingest_that_names_v1_gets_v1(secret: str) -> None:
    async with running_worker(secret) as (_, url):
        ws = await _connect(url, secret, [Subprotocol("framerelay.v1")])
        try:
            chosen, hello = ws.subprotocol, await _next(ws, version=1)
        finally:
            await ws.close()
    assert chosen == "framerelay.v1" and isinstance(hello, wire.Hello)


async def test_an_ingest_of_unknown_versions_only_is_refused_with_the_reason(secret: str) -> None:
    async with running_worker(secret) as (worker, url):
        ws = await _connect(url, secret, [Subprotocol("framerelay.v9")])
        try:
            await asyncio.wait_for(ws.recv(), WAIT_S)
        except ConnectionClosed as exc:
            assert exc.rcvd is not None
            closed = worker.metrics.tunnels_closed.labels("protocol")._value.get()
            code, reason = exc.rcvd.code, exc.rcvd.reason
        else:
            raise AssertionError("the worker sent a message instead of closing")
    assert code == 1002 and closed == 1
    assert reason == (
        "no common tunnel version: this worker speaks framerelay.v2, framerelay.v1; "
        "the peer offered framerelay.v9"
    )
