"""The tunnel's application heartbeat: the stall decision (pure, with a fake clock),
then a real in-process worker behind a TCP proxy that can freeze (nothing
forwarded either way, as with a SIGSTOPped worker or a black-holed network)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from framerelay.results import ResultRecord
from ingest.settings import IngestSettings, StreamConfig
from ingest.stream import IngestStream, StreamState
from ingest.tunnel_client import TunnelClient, supervise
from ingest.tunnel_health import Cause, TunnelHealth, TunnelState
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, token

# -- the decision, pure --------------------------------------------------------


@pytest.mark.parametrize(
    ("floor", "rtts", "min_fps", "want"),
    [
        (3.0, [], None, 3.0),  # nothing measured: the floor
        (3.0, [0.001] * 10, 5.0, 3.0),  # loopback, 5 fps: 3 ms + 0.4 s < 3 s
        (3.0, [0.5] * 10, 1.0, 3.5),  # 3 x 0.5 + 2 / 1
        (1.0, [0.1] * 18 + [2.0] * 2, 10.0, 6.2),  # p95 follows the tail: 3 x 2 + 0.2
        (0.5, [], 0.5, 4.0),  # one frame every 2 s: two intervals
    ],
)
def test_threshold_formula(
    floor: float, rtts: list[float], min_fps: float | None, want: float
) -> None:
    health = TunnelHealth(floor)
    for i, rtt in enumerate(rtts):
        health.pong(float(i), float(i) + rtt)
    assert health.threshold(min_fps) == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_threshold_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="stall_after_s"):
        TunnelHealth(bad)


def test_silence_stalls_a_pong_recovers_and_too_long_reconnects() -> None:
    h = TunnelHealth(3.0)
    h.reset(100.0)
    h.pong(100.0, 100.001)  # ping sent at 100.0, answered
    assert not h.check(102.9, None, 5.0).stalled
    v = h.check(103.01, None, 5.0)  # 3 s since the answered ping was sent
    assert v.stalled and v.changed and not v.reconnect and h.cause is Cause.SILENT
    assert "no heartbeat or result for 3.0 s" in (v.reason or "")
    assert h.stalls == 1
    v = h.check(105.0, None, 5.0)
    assert v.stalled and not v.changed and not v.reconnect
    h.pong(103.5, 105.5)  # the pong held up by the stall: alive again, rtt not kept
    assert len(h.rtts) == 1
    v = h.check(105.5, None, 5.0)
    assert not v.stalled and v.changed and h.stalls == 1
    h.check(109.0, None, 5.0)  # silent again (answered ping sent at 103.5 + 3)
    assert h.stalled and h.stalls == 2
    assert h.check(112.1, None, 5.0).reconnect  # stalled another threshold


def test_frames_without_results_stall_even_while_pongs_come() -> None:
    h = TunnelHealth(3.0)
    h.reset(0.0)
    h.result(1.0, 0.05)
    for t in range(2, 12):  # heartbeats keep coming
        h.pong(float(t), float(t) + 0.001)
        sent_at = 1.5  # one frame in flight since 1.5, never answered
        v = h.check(float(t) + 0.01, sent_at, 5.0)
        assert v.stalled == (t >= 5), t  # 4.51 - 1.5 > 3 from t = 5 on
    assert h.cause is Cause.NO_RESULTS and "still answers heartbeats" in (h.reason or "")
    h.pong(12.0, 12.001)  # pongs alone do not end this stall
    assert h.check(12.01, None, 5.0).stalled
    h.result(12.5, 0.05)
    v = h.check(12.5, None, 5.0)
    assert not v.stalled and v.changed


def test_an_idle_stream_sending_again_is_no_stall() -> None:
    h = TunnelHealth(3.0)
    h.reset(0.0)
    h.result(1.0)
    for t in range(2, 60):
        h.pong(float(t), float(t) + 0.001)
    assert not h.check(60.0, 59.9, 5.0).stalled  # a frame sent just now, last result long ago


def test_silent_then_no_results_is_one_stall() -> None:
    """After SIGCONT the pong may come before the results: still one stall, same start."""
    h = TunnelHealth(3.0)
    h.reset(0.0)
    h.pong(0.0, 0.001)
    assert h.check(3.5, 0.2, 5.0).stalled  # frozen at ~0.2 with a frame in flight
    since = h.stalled_since
    h.pong(3.6, 4.0)  # pong first
    v = h.check(4.0, 0.2, 5.0)
    assert v.stalled and not v.changed and h.cause is Cause.NO_RESULTS
    assert h.stalled_since == since and h.stalls == 1
    h.result(4.01, 3.8)  # then the result; its round trip measured the stall: not kept
    assert not h.check(4.02, None, 5.0).stalled and list(h.rtts) == [0.001]


def test_settings_defaults_and_limits() -> None:
    s = IngestSettings()
    assert (s.heartbeat_interval_s, s.stall_after_s) == (0.5, 3.0)
    for field in ("heartbeat_interval_s", "stall_after_s"):
        for bad in (0, -1, float("inf"), float("nan"), 1e9):
            with pytest.raises(ValueError, match=field):
                IngestSettings.model_validate({field: bad})


# -- a real worker behind a freezable proxy --------------------------------------


class FreezableProxy:
    """TCP proxy on 127.0.0.1; ``frozen`` stops all forwarding (new connections too)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.running = asyncio.Event()
        self.running.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def frozen(self) -> bool:
        return not self.running.is_set()

    def freeze(self) -> None:
        self.running.clear()

    def thaw(self) -> None:
        self.running.set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.thaw()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.running.wait()
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        pumps = [self._pump(reader, up_w), self._pump(up_r, writer)]
        for coro in pumps:
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self.running.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()


@contextlib.asynccontextmanager
async def tunnel(
    secret: str, **client_kw: Any
) -> AsyncIterator[tuple[TunnelClient, FreezableProxy, list[ResultRecord], IngestStream]]:
    """A worker, a proxy to it, a client through the proxy with one real-time stream."""
    records: list[ResultRecord] = []
    async with running_worker(secret) as (_, url):
        host, port = url.split("//")[1].split("/")[0].split(":")
        proxy = FreezableProxy((host, int(port)))
        proxied = f"ws://127.0.0.1:{await proxy.start()}/v1/tunnel"
        client = TunnelClient(proxied, lambda: token(secret), records.append, **client_kw)
        cfg = StreamConfig(id="cam", url=str(CLIP), fps=5, realtime=True, loop=True)
        stream = IngestStream(cfg, asyncio.get_running_loop(), 4, link_up=client.connected.is_set)
        client.add(stream)
        stream.launch()
        stop = asyncio.Event()
        task = asyncio.create_task(supervise(client, stop))
        try:
            await wait_until_async(lambda: len(records) >= 5, 60, "first results")
            yield client, proxy, records, stream
        finally:
            stream.stop()
            stop.set()
            await proxy.close()
            await asyncio.wait_for(task, 15)
            await asyncio.to_thread(stream.join, 10)


FAST: dict[str, Any] = {"heartbeat_interval_s": 0.1, "stall_after_s": 1.0}


def _state(stream: IngestStream) -> StreamState:
    """The state now (a call, so that mypy does not keep an earlier narrowing)."""
    return stream.state


def _tunnel_state(client: TunnelClient) -> TunnelState:
    """The tunnel's state now (a call, for the same reason)."""
    return client.state


async def test_frozen_link_stalls_the_tunnel_and_its_streams_then_recovers(secret: str) -> None:
    async with tunnel(secret, **FAST) as (client, proxy, records, stream):
        assert client.state is TunnelState.UP
        proxy.freeze()
        t0 = time.monotonic()
        await wait_until_async(
            lambda: _tunnel_state(client) is TunnelState.STALLED, 5, "stall", every_s=0.02
        )
        stalled = time.monotonic()
        assert stream.state is StreamState.STALLED and stream.stalled is not None
        assert "not answering" in stream.stalled and client.health.stalls == 1
        assert client.describe()["state"] == "STALLED"
        await asyncio.sleep(max(0.0, t0 + 1.5 - time.monotonic()))
        n = len(records)
        proxy.thaw()
        t1 = time.monotonic()
        await wait_until_async(lambda: client.state is TunnelState.UP, 5, "recovery")
        await wait_until_async(lambda: len(records) > n + 3, 10, "results after the thaw")
        assert _state(stream) is StreamState.RUNNING and stream.stalled is None
        assert client.connects == 1  # recovered in the same session: no reconnect
        got = {"stall_s": stalled - t0, "results_s": time.monotonic() - t1}
    print(f"\nfrozen link: STALLED after {got['stall_s']:.2f} s (threshold 1.0 s), "
          f"results again {got['results_s']:.2f} s after the thaw")  # fmt: skip
    assert got["stall_s"] <= 1.0 + 0.5 * TIMEOUT_FACTOR


async def test_a_stall_longer_than_twice_the_threshold_reconnects(secret: str) -> None:
    async with tunnel(secret, **FAST) as (client, proxy, records, stream):
        proxy.freeze()
        await wait_until_async(lambda: client.state is TunnelState.STALLED, 5, "stall")
        await wait_until_async(lambda: client.state is not TunnelState.STALLED, 5, "close")
        assert stream.state is StreamState.STALLED  # until its next result
        assert client.unhealthy
        n = len(records)
        proxy.thaw()
        t1 = time.monotonic()
        await wait_until_async(lambda: len(records) > n + 3, 15, "results after reconnecting")
        assert client.state is TunnelState.UP and _state(stream) is StreamState.RUNNING
        assert not client.unhealthy
        connects, disconnected, took = (
            client.connects,
            stream.counters["disconnected"],
            time.monotonic() - t1,
        )
    print(f"\nreconnected after the stall; results {took:.2f} s after the thaw, "
          f"{disconnected} frame(s) counted disconnected")  # fmt: skip
    assert connects == 2


async def test_a_worker_that_answers_pings_but_not_frames_stalls(secret: str) -> None:
    """Hung inference: the worker's event loop answers pongs, no result comes."""
    fault: dict[str, Any] = {"test_hooks": True, "test_fault": "hang_inference_after:3"}

    records: list[ResultRecord] = []
    async with running_worker(secret, **fault) as (_, url):
        client = TunnelClient(url, lambda: token(secret), records.append, **FAST)
        cfg = StreamConfig(id="cam", url=str(CLIP), fps=5, realtime=True, loop=True)
        loop = asyncio.get_running_loop()
        stream = IngestStream(cfg, loop, 4, link_up=client.connected.is_set)
        client.add(stream)
        stream.launch()
        stop = asyncio.Event()
        task = asyncio.create_task(supervise(client, stop))
        try:
            await wait_until_async(lambda: len(records) >= 2, 60, "first results")
            t0 = time.monotonic()
            await wait_until_async(lambda: client.state is TunnelState.STALLED, 10, "stall")
            assert client.health.pong_at is not None
            assert time.monotonic() - client.health.pong_at < 0.5  # pongs still come
            reason, took = stream.stalled or "", time.monotonic() - t0
        finally:
            stream.stop()
            stop.set()
            await asyncio.wait_for(task, 15)
            await asyncio.to_thread(stream.join, 10)
    print(f"\nhung inference: STALLED {took:.2f} s after the last result: {reason}")
    assert "still answers heartbeats" in reason
