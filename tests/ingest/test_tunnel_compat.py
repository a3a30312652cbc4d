"""The ingest's tunnel client against workers of other versions (real sockets, real streams).

* a newer worker whose HELLO, RESULT and ERROR carry fields this ingest does
  not know: results and errors are read as usual;
* a v1 worker (no subprotocol, the v1 codec as released: a strict reader of
  what the ingest sends): results flow;
* a worker that speaks none of the ingest's versions refuses the tunnel, and
  the ingest shows the worker's reason in its tunnel error.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from framerelay import wire
from framerelay.protocol import negotiation as versions
from framerelay.results import ResultRecord
from tests.conftest import TIMEOUT_FACTOR
from tests.support import wire_v1_peer as v1
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, streaming, token

WAIT_S = 30 * TIMEOUT_FACTOR
HELLO: dict[str, Any] = {
    "worker_id": "gpu-new",
    "input_w": 416,
    "input_h": 416,
    "class_names": ["person"],
    "providers": ["fake"],
    "max_inflight": 2,
}
Handler = Callable[[ServerConnection], Awaitable[None]]


def _message(mtype: wire.MsgType, head: dict[str, Any], payload: bytes = b"") -> bytes:
    raw = json.dumps(head).encode()
    return wire.PREFIX.pack(wire.VERSION, mtype, len(raw)) + raw + payload


async def _newer_worker(ws: ServerConnection) -> None:
    """v2 with fields from the future in HELLO, RESULT and ERROR."""
    hello = {**HELLO, "features": ["resume", "teleport"], "gpu": {"model": "H200"}}
    await ws.send(_message(wire.MsgType.HELLO, hello))
    async for data in ws:
        assert isinstance(data, bytes)
        header, _ = wire.decode(data)
        if not isinstance(header, wire.Frame):
            continue
        timing = header.timing_fields()
        if header.seq % 3 == 1:
            error = {"code": "capacity", "message": "busy", "stream_id": header.stream_id,
                     "seq": header.seq, "retry_after_ms": 20}  # fmt: skip
            await ws.send(_message(wire.MsgType.ERROR, error))
        else:
            result = {**timing, "n": 0, "timings": {"infer_ms": 1.0}, "model_rev": "b7"}
            await ws.send(_message(wire.MsgType.RESULT, result))


async def _v1_worker(ws: ServerConnection) -> None:
    """A worker from before negotiation: the v1 codec, strict both ways."""
    await ws.send(v1.encode(v1.Hello(**HELLO, encodings=["jpeg"])))
    async for data in ws:
        assert isinstance(data, bytes)
        header, _ = v1.decode(data)  # raises on anything a v1 reader refuses
        if isinstance(header, v1.Frame):
            timing = header.model_dump(include=set(v1.Timing.model_fields))
            await ws.send(v1.encode(v1.Result(**timing, n=0)))


@contextlib.asynccontextmanager
async def _fake(handler: Handler, *, negotiate: bool) -> AsyncIterator[str]:
    subprotocols = versions.offer() if negotiate else None
    async with serve(handler, "127.0.0.1", 0, compression=None, subprotocols=subprotocols) as srv:
        yield f"ws://127.0.0.1:{next(iter(srv.sockets)).getsockname()[1]}/v1/tunnel"


async def test_a_newer_worker_with_extra_fields_in_hello_result_and_error() -> None:
    records: list[ResultRecord] = []

    async with (
        _fake(_newer_worker, negotiate=True) as url,
        streaming(url, "t", records) as (
            client,
            stream,
        ),
    ):
        await wait_until_async(lambda: len(records) >= 6, WAIT_S, "results")
        await wait_until_async(lambda: stream.counters["worker_error"] >= 3, WAIT_S, "errors")
    assert client.worker_id == "gpu-new" and client.connects == 1 and client.errors == 0
    assert client.hello is not None and client.hello.features == ["resume", "teleport"]
    assert all(r.worker_id == "gpu-new" for r in records)
    assert (stream.last_error or "").startswith("worker error capacity: busy")


async def test_a_v1_worker_gets_frames_its_strict_reader_takes() -> None:
    records: list[ResultRecord] = []

    async with (
        _fake(_v1_worker, negotiate=False) as url,
        streaming(url, "t", records) as (
            client,
            _,
        ),
    ):
        await wait_until_async(lambda: len(records) >= 5, WAIT_S, "results from the v1 worker")
    assert client.connects == 1 and client.errors == 0 and client.last_error is None
    assert [r.seq for r in records] == sorted(r.seq for r in records)


async def test_a_worker_of_other_versions_refuses_and_the_ingest_says_why(
    secret: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    future = functools.partial(versions.select, supported=(3,))  # a v3-only worker
    monkeypatch.setattr(versions, "select", future)

    async with (
        running_worker(secret) as (_, url),
        streaming(url, token(secret), []) as (client, stream),
    ):
        await wait_until_async(lambda: stream.last_error is not None, WAIT_S, "the stream's error")
    assert client.connects == 0
    assert client.last_error == (
        "NoCommonVersion: the worker refused the tunnel: no common tunnel version: this worker "
        "speaks framerelay.v3; the peer offered framerelay.v2, framerelay.v1"
    )
    assert client.describe()["last_error"] == client.last_error == stream.last_error
