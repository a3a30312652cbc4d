"""Acceptance: malformed, oversized and truncated messages close only the
offending connection with a clear error; other streams keep flowing."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import cast

import httpx
import msgspec
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from framerelay import wire
from framerelay.protocol.negotiation import offer
from ingest.service import IngestService
from ingest.settings import IngestSettings, StreamConfig
from tests.conftest import CLIP
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, token

pytestmark = pytest.mark.integration

FRAME = wire.Frame(
    stream_id="bad-1", epoch=0, seq=0, pts=0, time_base=(1, 25), captured_at=time.time(),
    src_w=640, src_h=480, scale=0.65,
)  # fmt: skip


async def _raw(url: str, secret: str) -> ClientConnection:
    ws = await connect(url, additional_headers={"Authorization": f"Bearer {token(secret)}"},
                       compression=None, proxy=None, max_size=None,
                       subprotocols=offer())  # fmt: skip
    hello, _ = wire.decode(await ws.recv(decode=False))
    assert isinstance(hello, wire.Hello)
    return ws


Closed = tuple[int, str, list[wire.Header]]
"""A connection's close code, reason and the messages it got (:func:`_closed_with`)."""


async def _closed_with(ws: ClientConnection) -> Closed:
    """Read until the worker closes; returns the close code, reason and messages seen."""
    seen: list[wire.Header] = []
    try:
        async with asyncio.timeout(10):
            while True:
                seen.append(wire.decode(await ws.recv(decode=False))[0])
    except ConnectionClosed as exc:
        assert exc.rcvd is not None
        return exc.rcvd.code, exc.rcvd.reason, seen
    raise AssertionError("unreachable")


async def _next_error(ws: ClientConnection) -> wire.Error:
    header, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
    assert isinstance(header, wire.Error)
    return header


V = wire.VERSION
RESULT = wire.Result.of(FRAME, n=0)
BAD_MESSAGES = [
    ("malformed JSON", struct.pack(">BBI", V, 4, 5) + b"{oops", 1002, "JSON is malformed"),
    ("truncated", struct.pack(">BBI", V, 4, 500) + b'{"stream_id":', 1002, "truncated"),
    ("unknown type", struct.pack(">BBI", V, 42, 2) + b"{}", 1002, "unknown message type"),
    ("bad version", struct.pack(">BBI", 9, 4, 2) + b"{}", 1002, "protocol version 9 on a tunnel"),
    ("older version", struct.pack(">BBI", 1, 4, 2) + b"{}", 1002, "protocol version 1 on a tunnel"),
    ("schema", wire.encode(wire.Close(stream_id="x")).replace(b'"x"', b"42 "), 1002, "stream_id"),
    ("wrong direction", wire.encode(RESULT), 1002, "not accepted"),
    ("oversized", b"\x01\x04" + b"\0" * (9 * 1024 * 1024), 1009, ""),
]  # fmt: skip


@pytest.fixture(scope="module")
async def outcome(secret: str, anyio_backend: str) -> dict[str, object]:
    """One scenario for the module's tests (on the module-scoped loop: ``anyio_backend`` in
    tests/integration/conftest.py), what it saw by name."""
    out: dict[str, object] = {}
    async with running_worker(secret) as (_, url):
        settings = IngestSettings(
            worker_url=url, token_secrets=secret, worker_id="gpu-a",
            streams=[StreamConfig(id="good", url=str(CLIP), fps=10, realtime=True, loop=True)],
        )  # fmt: skip
        service = IngestService(settings)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))

        def good() -> int:
            return service.streams["good"].counters["results"] if service.streams else 0

        await wait_until_async(lambda: good() >= 5, 30, "5 results of the good stream")
        for name, data, _, _ in BAD_MESSAGES:
            before = good()
            ws = await _raw(url, secret)
            await ws.send(data)
            out[name] = await _closed_with(ws)
            await wait_until_async(lambda b=before: good() >= b + 3, 10, f"3 results after {name}")  # type: ignore[misc]
        ws = await _raw(url, secret)
        await ws.send("text is not allowed")
        out["text"] = await _closed_with(ws)
        out["per_frame"] = await _per_frame_errors(url, secret)
        out["good"] = dict(service.streams["good"].counters)
        base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
        async with httpx.AsyncClient() as http:
            out["metrics"] = (await http.get(f"{base}/metrics")).text
        out["connects"] = service.client.connects
        stop.set()
        await task
    return out


async def _per_frame_errors(url: str, secret: str) -> list[tuple[str, int | None]]:
    ws = await _raw(url, secret)
    errors = []
    await ws.send(wire.encode(FRAME, b"\xff\xd8 not a jpeg"))  # stream not opened
    errors.append(await _next_error(ws))
    await ws.send(wire.encode(wire.Open(stream_id="bad-1")))
    await ws.send(wire.encode(msgspec.structs.replace(FRAME, seq=1), b"\xff\xd8 not a jpeg"))
    errors.append(await _next_error(ws))
    await ws.send(wire.encode(wire.Open(stream_id="bad-2", tracker="no-such-tracker")))
    errors.append(await _next_error(ws))
    await ws.close()
    return [(e.code, e.seq) for e in errors]


@pytest.mark.parametrize(("name", "code", "reason"), [(n, c, r) for n, _, c, r in BAD_MESSAGES])
def test_bad_message_closes_only_its_connection(
    outcome: dict[str, object], name: str, code: int, reason: str
) -> None:
    got_code, got_reason, seen = cast(Closed, outcome[name])
    assert got_code == code
    if reason:
        assert any(r in got_reason for r in reason.split("|")) or any(
            isinstance(m, wire.Error) and any(r in m.message for r in reason.split("|"))
            for m in seen
        )


def test_text_frames_are_refused(outcome: dict[str, object]) -> None:
    code, reason, _ = cast(Closed, outcome["text"])
    assert code == 1003 and "text" in reason


def test_per_frame_problems_answer_that_frame_and_keep_the_connection(
    outcome: dict[str, object],
) -> None:
    assert outcome["per_frame"] == [("unknown_stream", 0), ("bad_image", 1), ("bad_tracker", None)]


def test_good_stream_never_noticed(outcome: dict[str, object]) -> None:
    good = cast("dict[str, int]", outcome["good"])  # the stream's counters
    assert outcome["connects"] == 1
    assert good["disconnected"] == 0 and good["worker_error"] == 0
    assert good["results"] >= 5 + 3 * len(BAD_MESSAGES)


def test_worker_metrics_count_stages_and_drops(outcome: dict[str, object]) -> None:
    metrics = str(outcome["metrics"])
    for needle in (
        'framerelay_worker_stage_seconds_bucket{le="0.05",stage="infer"}',
        'framerelay_worker_stage_seconds_count{stage="decode"}',
        'framerelay_worker_frames_total{outcome="ok"}',
        'framerelay_worker_frames_total{outcome="protocol_error"}',
        'framerelay_worker_drops_total{reason="bad_image"} 1.0',
        "framerelay_worker_ready 1.0",
    ):
        assert needle in metrics, needle
