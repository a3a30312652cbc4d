"""Raw tunnel peers for the fault matrix: a probing client and a flooding client (both
with a valid worker token, against a real worker), and a fake worker that answers an
ingest with bad numbers.

Bad numbers go in as JSON text (``NaN``, ``Infinity``, ``1e400``, ``2**64`` ...), put
in place of one field of an otherwise valid header, so that every numeric field is
tried with every value.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections import Counter
from typing import Any

import msgspec
import numpy as np
import simplejpeg
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from framerelay import wire
from framerelay.errors import ProtocolError
from framerelay.protocol.negotiation import offer

FRAME_FIELDS = ("epoch", "seq", "pts", "time_base.0", "time_base.1", "captured_at",
                "src_w", "src_h", "scale")  # fmt: skip
CLOCK_FIELDS = ("clock.epoch", "clock.offset", "clock.last_t", "clock.last_captured")
HELLO_FIELDS = ("input_w", "input_h", "max_inflight")
RESULT_FIELDS = ("epoch", "seq", "pts", "time_base.0", "time_base.1", "captured_at", "n",
                 "timings.infer")  # fmt: skip
SNAPSHOT_FIELDS = ("seq", "clock.epoch", "clock.offset", "clock.last_t", "clock.last_captured")
SENTINEL = 987654321.125
FLOOD_ADDR = "127.0.0.2"
"""The flooder's source address: the worker throttles misbehaving addresses (429), and the
ingest's own tunnel comes from 127.0.0.1."""
PROBE_ADDRS = [f"127.0.{i}.{j}" for i in (1, 2) for j in range(3, 250)]
"""The probe's source addresses, a new one per tunnel: it closes tunnels on purpose (a
protocol error each) and must not be throttled before every field was tried."""
ANSWER_TIMEOUT_S = 5.0
GIVE_UP = 3
"""Cases in a row without an answer after which the probe stops (the worker is stuck)."""
JPEG = simplejpeg.encode_jpeg(np.full((416, 416, 3), 114, np.uint8), colorsubsampling="420")


def with_value(header: dict[str, Any], path: str, value: str) -> bytes:
    """``header`` as JSON with the field at ``path`` (dots: nested keys or list indexes)
    holding the JSON text ``value``."""
    data = json.loads(json.dumps(header))
    *parents, last = path.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if isinstance(node, list):
        node[int(last)] = SENTINEL
    else:
        node[last] = SENTINEL
    return json.dumps(data).replace(repr(SENTINEL), value).encode()


def message(mtype: wire.MsgType, head: bytes, payload: bytes = b"") -> bytes:
    return wire.PREFIX.pack(wire.VERSION, mtype, len(head)) + head + payload


def frame_header(stream_id: str, epoch: int, seq: int, pts_s: float) -> dict[str, Any]:
    header: dict[str, Any] = msgspec.to_builtins(wire.Frame(
        stream_id=stream_id, epoch=epoch, seq=seq, pts=round(pts_s * 90_000),
        time_base=(1, 90_000), captured_at=time.time(), src_w=416, src_h=416, scale=1.0,
    ))  # fmt: skip
    return header


def clock(epoch: int = 0) -> dict[str, Any]:
    return {"epoch": epoch, "offset": 0.0, "last_t": 1.0, "last_captured": time.time()}


# -- probing a worker ---------------------------------------------------------------


class Probe:
    """One raw tunnel to a worker; reconnects (and re-opens its streams) after a close."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.ws: ClientConnection | None = None
        self.snapshot: tuple[dict[str, Any], bytes] | None = None
        self.connects = 0

    async def _ensure(self) -> ClientConnection:
        if self.ws is None:
            auth = {"Authorization": f"Bearer {self.token}"}
            local = (PROBE_ADDRS[self.connects % len(PROBE_ADDRS)], 0)
            self.ws = await connect(self.url, proxy=None, compression=None, max_size=None,
                                    additional_headers=auth, local_addr=local,
                                    subprotocols=offer())  # fmt: skip
            self.connects += 1
            hello, _ = wire.decode(await asyncio.wait_for(self.ws.recv(decode=False), 10))
            assert isinstance(hello, wire.Hello)
            await self.ws.send(wire.encode(wire.Open(stream_id="probe")))
        return self.ws

    async def ask(self, *messages: bytes, want_seq: int | None = None) -> str:
        """Send ``messages``; the answers until a RESULT/ERROR for ``want_seq`` (any, when
        None), a close, or a timeout, as ``error:<code>``/``result``/``closed:<code>``."""
        ws = await self._ensure()
        got: list[str] = []
        try:
            for data in messages:
                await ws.send(data)
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                while True:
                    header, payload = wire.decode(await ws.recv(decode=False))
                    if isinstance(header, wire.Snapshot):
                        self.snapshot = (msgspec.to_builtins(header.clock), payload)
                        continue
                    got.append(_answer(header))
                    if want_seq is None or getattr(header, "seq", None) in (want_seq, None):
                        return ",".join(got)
        except ConnectionClosed as exc:
            self.ws = None
            code = exc.rcvd.code if exc.rcvd is not None else "none"
            return ",".join([*got, f"closed:{code}"])
        except TimeoutError:
            return ",".join([*got, "no answer"])
        except ProtocolError:  # the worker answered with something the wire refuses
            return ",".join([*got, "garbled answer"])

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def _answer(header: wire.Header) -> str:
    if isinstance(header, wire.Result):
        return "result"
    return f"error:{header.code}" if isinstance(header, wire.Error) else type(header).__name__


async def probe_worker(url: str, token: str, values: tuple[str, ...]) -> dict[str, str]:
    """Every numeric FRAME and OPEN (session clock) field with every value; then a valid
    frame, which must still get its result."""
    probe = Probe(url, token)
    outcomes: dict[str, str] = {}
    seq = itertools.count(1)
    for i in range(3):  # a few valid frames, 1 s apart: the worker sends a snapshot
        n = next(seq)
        outcomes[f"warm-up {i}"] = await probe.ask(
            message(wire.MsgType.FRAME, json.dumps(frame_header("probe", 0, n, i)).encode(),
                    JPEG), want_seq=n)  # fmt: skip
    for epoch, (name, value) in enumerate(itertools.product(FRAME_FIELDS, values), start=1):
        if _gave_up(outcomes):
            break
        n = next(seq)
        head = with_value(frame_header("probe", epoch, n, float(epoch)), name, value)
        want = None if name == "seq" else n
        outcomes[f"FRAME {name}={value}"] = await probe.ask(
            message(wire.MsgType.FRAME, head, JPEG), want_seq=want
        )
    snap_clock, blob = probe.snapshot or (clock(), b"")
    for i, (name, value) in enumerate(itertools.product(CLOCK_FIELDS, values)):
        if _gave_up(outcomes):
            break
        sid, n = f"probe-clock-{i}", next(seq)
        head = with_value({"stream_id": sid, "tracker": "default", "clock": snap_clock}, name,
                          value)  # fmt: skip
        frame = json.dumps(frame_header(sid, 0, n, 5.0)).encode()
        outcomes[f"OPEN {name}={value}"] = await probe.ask(
            message(wire.MsgType.OPEN, head, blob),
            message(wire.MsgType.FRAME, frame, JPEG),
            want_seq=n,
        )
    n = next(seq)
    outcomes["valid frame after all"] = await probe.ask(
        message(wire.MsgType.FRAME, json.dumps(frame_header("probe", 10**6, n, 1e4)).encode(),
                JPEG), want_seq=n)  # fmt: skip
    outcomes["connections"] = str(probe.connects)
    await probe.close()
    return outcomes


def _gave_up(outcomes: dict[str, str]) -> bool:
    """The worker stopped answering: the last GIVE_UP cases got no answer."""
    last = list(outcomes.values())[-GIVE_UP:]
    return len(last) == GIVE_UP and all(v.endswith("no answer") for v in last)


def summarise(outcomes: dict[str, str], non_finite: frozenset[str]) -> dict[str, Any]:
    """Refused (an ERROR or a close), accepted (a RESULT), or unanswered, per case."""
    cases = {k: v for k, v in outcomes.items() if k.startswith(("FRAME ", "OPEN "))}
    accepted = [k for k, v in cases.items() if v.split(",")[-1] == "result"
                and not (k.startswith("OPEN ") and "error:" in v)]  # fmt: skip
    return {
        "cases": len(cases),
        "refused": sum(1 for v in cases.values() if "error:" in v or "closed:" in v),
        "accepted": accepted,
        "accepted_non_finite": [k for k in accepted if k.rsplit("=", 1)[1] in non_finite],
        "no_answer": [k for k, v in cases.items() if v.endswith("no answer")],
        "garbled_answer": [k for k, v in cases.items() if v.endswith("garbled answer")],
        "answers": dict(Counter(v.split(",")[0] for v in cases.values())),
        "warm_up": [outcomes[f"warm-up {i}"] for i in range(3)],
        "valid_after": outcomes["valid frame after all"],
        "connections": int(outcomes["connections"]),
    }


# -- flooding a worker ----------------------------------------------------------------


async def flood(
    url: str, token: str, seconds: float, *, rate: float = 300.0, max_messages: int = 3000
) -> dict[str, int]:
    """Invalid headers (each ends the connection), bad JPEGs and bursts of valid frames
    beyond the credit, at about ``rate`` messages a second, for ``seconds`` at most."""
    counts: Counter[str] = Counter()
    deadline, sent = time.monotonic() + seconds, 0
    while time.monotonic() < deadline and sent < max_messages:
        try:
            sent += await _flood_once(url, token, deadline, rate, counts)
        except InvalidStatus as exc:  # throttled: the worker's defence
            counts[f"refused:{exc.response.status_code}"] += 1
            await asyncio.sleep(0.1)
    counts["sent"] = sent
    return dict(counts)


async def _flood_once(
    url: str, token: str, deadline: float, rate: float, counts: Counter[str]
) -> int:
    sent = 0
    async with connect(url, proxy=None, compression=None, max_size=None,
                       additional_headers={"Authorization": f"Bearer {token}"},
                       local_addr=(FLOOD_ADDR, 0), subprotocols=offer()) as ws:  # fmt: skip
        counts["connections"] += 1
        reader = asyncio.create_task(_drain(ws, counts))
        await ws.send(wire.encode(wire.Open(stream_id="flood")))
        with contextlib.suppress(ConnectionClosed):
            for i in range(60):
                if time.monotonic() > deadline:
                    break
                await ws.send(_flood_message(i, sent))
                sent += 1
                await asyncio.sleep(1 / rate)
        with contextlib.suppress(TimeoutError):  # the worker closes after the invalid header
            await asyncio.wait_for(asyncio.shield(reader), 2)
        reader.cancel()
    return sent


def _flood_message(i: int, n: int) -> bytes:
    if i == 59:  # last of each connection: an invalid header
        return message(wire.MsgType.FRAME, b'{"stream_id": "flood", "epoch": NaN}')
    head = json.dumps(frame_header("flood", 0, n, n / 25)).encode()
    if i % 4 == 0:
        return message(wire.MsgType.FRAME, head, b"\xff\xd8 not a jpeg at all")
    return message(wire.MsgType.FRAME, head, JPEG)


async def _drain(ws: ClientConnection, counts: Counter[str]) -> None:
    try:
        async for data in ws:
            header, _ = wire.decode(data if isinstance(data, bytes) else data.encode())
            counts[getattr(header, "code", type(header).__name__)] += 1
    except ConnectionClosed as exc:
        counts[f"closed:{exc.rcvd.code if exc.rcvd else 'none'}"] += 1
    except Exception:  # a garbled answer is counted, not raised
        counts["bad answer"] += 1


# -- a fake worker ---------------------------------------------------------------------


class FakeWorker:
    """A tunnel server that speaks just enough protocol to an ingest: a HELLO, then a
    RESULT for every FRAME, each connection and each answer carrying the next bad case
    (HELLO fields at connect, RESULT and SNAPSHOT fields after). Runs in a thread."""

    def __init__(self, values: tuple[str, ...]) -> None:
        fields = [("HELLO", f) for f in HELLO_FIELDS] + [("RESULT", f) for f in RESULT_FIELDS]
        fields += [("SNAPSHOT", f) for f in SNAPSHOT_FIELDS]
        self.cases = [(kind, f, v) for v in values for kind, f in fields]
        self.tried: list[str] = []
        self.connections = 0
        self.frames = 0
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> FakeWorker:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.url and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def summary(self) -> dict[str, Any]:
        return {"connections": self.connections, "frames": self.frames,
                "cases_tried": len(self.tried), "first_cases": self.tried[:6]}  # fmt: skip

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server: Server
        async with serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None,
                         subprotocols=offer()) as server:  # fmt: skip
            port = next(iter(server.sockets)).getsockname()[1]
            self.url = f"ws://127.0.0.1:{port}/v1/tunnel"
            await self._stop.wait()

    def _peek(self) -> str | None:
        """The kind of the next case (None when all were tried)."""
        return self.cases[len(self.tried)][0] if len(self.tried) < len(self.cases) else None

    def _next(self) -> tuple[str, str, str]:
        case = self.cases[len(self.tried)]
        self.tried.append(f"{case[0]} {case[1]}={case[2]}")
        return case

    async def _handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        hello = msgspec.to_builtins(wire.Hello(
            worker_id="fake-worker", input_w=416, input_h=416, class_names=["person"],
            providers=["fake"], max_inflight=4))  # fmt: skip
        if self._peek() == "HELLO":
            _, name, value = self._next()
            await ws.send(message(wire.MsgType.HELLO, with_value(hello, name, value)))
        else:
            await ws.send(message(wire.MsgType.HELLO, json.dumps(hello).encode()))
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                if self._peek() == "HELLO":  # the next case needs a new connection
                    await ws.close()
                    return
                if isinstance(data, bytes) and data[1] == wire.MsgType.FRAME:
                    await self._answer(ws, data)

    async def _answer(self, ws: ServerConnection, data: bytes) -> None:
        self.frames += 1
        header, _ = wire.decode(data)
        assert isinstance(header, wire.Frame)
        timing = msgspec.to_builtins(header.timing_fields())
        result = {**timing, "n": 0, "timings": {"infer": 1.0}}
        kind = self._peek()
        if kind == "RESULT":
            _, name, value = self._next()
            await ws.send(message(wire.MsgType.RESULT, with_value(result, name, value)))
            return
        await ws.send(message(wire.MsgType.RESULT, json.dumps(result).encode()))
        if kind == "SNAPSHOT":
            _, name, value = self._next()
            snap = {"stream_id": header.stream_id, "seq": header.seq, "clock": clock()}
            await ws.send(message(wire.MsgType.SNAPSHOT, with_value(snap, name, value)))
