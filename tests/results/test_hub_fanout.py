"""Acceptance 1: one subscriber that never reads does not delay the 49 others.

Two identical hub processes publish real results at 25/s on one stream, each
to 49 WebSocket subscribers; one hub also has a 50th subscriber that completes
the handshake and then never reads (hub B in a first run, hub A in a second).
Running both at once pairs the measurements: whatever else loads this machine
hits both alike (alternating runs of one hub varied by more than ±20 % between
identical runs here).
The hubs publish half a period apart, so in the subscribers' process one
hub's burst of 49 messages never waits behind the other's. Delivery delay is
the subscriber's receive time minus the moment its hub published the result.
The stuck subscriber must be cut off by policy (queue drops, then the send
timeout: 4408), and B's p99 must not exceed A's by more than 20 %.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import ROOT, TIMEOUT_FACTOR, service_env
from tests.support.auth import mint
from tests.support.results_hub import p99
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READERS = 49
RATE = 25.0
WINDOW_S = 6.0
WARMUP_S = 1.0
QUEUE = 32
SEND_TIMEOUT_S = 2.0
RECEIVED_AT = re.compile(r'"received_at":([0-9.e+-]+)')


@pytest.fixture()
def hubs(real_results: Path, secret: str) -> Iterator[tuple[str, str]]:
    script = str(ROOT / "tests" / "results" / "hub_server.py")
    env = service_env(FRAMERELAY_TOKEN_SECRETS=secret)
    procs = []
    for phase in (0.0, 0.5):  # half a period apart: one hub's burst never queues behind
        args = [
            "--records", str(real_results), "--rate", str(RATE), "--stream", "cam-1",
            "--queue-size", str(QUEUE), "--send-timeout", str(SEND_TIMEOUT_S),
            "--send-buffer", "32768", "--phase", str(phase),
        ]  # fmt: skip
        cmd = [sys.executable, script, *args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    hosts = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("{"), "hub server did not start"
        hosts.append(f"127.0.0.1:{json.loads(line)['port']}")
    yield hosts[0], hosts[1]
    for proc in procs:
        proc.terminate()
        proc.wait(20)
        assert proc.stdout is not None
        proc.stdout.close()


async def _reader(url: str, token: str, since: list[float], out: list[float]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(url, additional_headers=headers, compression=None, proxy=None) as ws:
        async for raw in ws:
            now = time.time()
            match = RECEIVED_AT.search(str(raw))  # cheaper than json.loads: keep readers light
            if match and '"type":"result"' in str(raw):
                sent = float(match.group(1))
                if sent >= since[0]:
                    out.append((now - sent) * 1000)


def _stuck_subscriber(host: str, token: str) -> socket.socket:
    """Handshake by hand on a socket with a tiny receive buffer, then never read again."""
    h, port = host.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((h, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (f"GET /v1/results?stream=cam-1 HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
         f"Authorization: Bearer {token}\r\n\r\n").encode()
    )  # fmt: skip
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head[:100]
    return sock


async def _measure(
    hosts: tuple[str, str], token: str, stuck_on: int
) -> tuple[list[float], list[float], socket.socket]:
    """49 readers on each hub, a stuck 50th on ``hosts[stuck_on]``: (alone, beside stuck)."""
    since = [float("inf")]
    delays: tuple[list[float], list[float]] = ([], [])
    tasks = [
        asyncio.create_task(_reader(f"ws://{host}/v1/results?stream=cam-1", token, since, out))
        for host, out in zip(hosts, delays, strict=True)
        for _ in range(READERS)
    ]
    stuck = await asyncio.to_thread(_stuck_subscriber, hosts[stuck_on], token)
    await asyncio.sleep(WARMUP_S)
    since[0] = time.time()
    await asyncio.sleep(WINDOW_S)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return delays[1 - stuck_on], delays[stuck_on], stuck


def _metric(host: str, name: str) -> float:
    text = httpx.get(f"http://{host}/metrics").text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_a_stuck_subscriber_does_not_delay_the_others(
    hubs: tuple[str, str], secret: str
) -> None:
    token = mint(secret, ["results:cam-1"], "ingest", ttl=600, sub="app")
    alone: list[float] = []
    beside_stuck: list[float] = []
    stuck = []
    try:
        for stuck_on in (1, 0):  # the stuck one on B, then on A: no hub is favoured
            a, b, jammed = await _measure(hubs, token, stuck_on)
            alone += a
            beside_stuck += b
            stuck.append(jammed)
        expected = READERS * RATE * WINDOW_S * 2
        assert len(alone) > 0.9 * expected and len(beside_stuck) > 0.9 * expected
        p_alone, p_stuck = p99(alone), p99(beside_stuck)
        print(f"\n49 readers, p99 delivery delay: {p_alone:.2f} ms without, {p_stuck:.2f} ms "
              f"with a stuck 50th: {p_stuck / p_alone:.2f}x")  # fmt: skip
        # Each stuck one overflowed its queue (oldest dropped), then its send timed out (4408).
        for host in hubs:

            def too_slow_once(h: str = host) -> bool:
                return _metric(h, 'framerelay_hub_disconnects_total{reason="too_slow"}') == 1

            await wait_until_async(
                too_slow_once, 15, "the stuck subscriber was disconnected as too slow"
            )
            assert _metric(host, "framerelay_hub_results_dropped_total") > 0
        assert p_stuck <= 1.2 * p_alone * TIMEOUT_FACTOR, (p_alone, p_stuck)
    finally:
        for sock in stuck:
            sock.close()
