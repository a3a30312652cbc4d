"""A UDP stream deleted through the API frees its port at once: re-added within 1 s, it runs.

A real MPEG-TS sender (ffmpeg, ``udp://127.0.0.1:PORT``) feeds the real ingest
app. The hard case is a camera gone silent: the decode thread then sits in a
blocking read, which used to last the whole read timeout (10 s) and hold the
port, so the re-added stream failed with "Address already in use".
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import MemoryStore
from tests.conftest import CLIP
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
SECRET = "not-a-real-secret-but-long-enough"


@contextlib.contextmanager
def udp_sender(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The sample clip, looped in real time, as MPEG-TS datagrams to 127.0.0.1:port."""
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i",
           str(CLIP), "-c", "copy", "-bsf:v", "dump_extra", "-f", "mpegts",
           f"udp://127.0.0.1:{port}?pkt_size=1316"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


@contextlib.asynccontextmanager
async def ingest() -> AsyncIterator[tuple[IngestService, httpx.AsyncClient]]:
    settings = IngestSettings(worker_url=f"ws://127.0.0.1:{free_port()}/v1/tunnel",
                              token_secrets=SECRET)  # fmt: skip
    service = IngestService(settings, store=MemoryStore())
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    token = mint(SECRET, ["streams:read", "streams:write"], "ingest", ttl=600)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(service)), base_url="http://ingest",
            headers={"Authorization": f"Bearer {token}"},
        ) as http:  # fmt: skip
            await wait_until_async(service.started.is_set, 10, "service start")
            yield service, http
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _stream(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await http.get(f"/v1/streams/{sid}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _decoding(http: httpx.AsyncClient, sid: str, after: int = 0) -> None:
    status: dict[str, Any] = {}

    async def decoded() -> bool:
        nonlocal status
        status = await _stream(http, sid)
        return int(status["decoded"]) > after

    await wait_until_async(decoded, 15, lambda: f"{sid} decoding: {status}")


@pytest.mark.parametrize("camera", ["silent", "sending"])
async def test_delete_then_readd_on_the_same_udp_port_within_a_second(camera: str) -> None:
    port = free_port()
    body = {"id": "udp-cam", "url": f"udp://127.0.0.1:{port}", "fps": 5}

    async with ingest() as (service, http):
        with udp_sender(port) as sender:
            assert (await http.post("/v1/streams", json=body)).status_code == 201
            await _decoding(http, "udp-cam")
            old = service.registry.get("udp-cam")
            if camera == "silent":
                sender.kill()
                await asyncio.to_thread(sender.wait, 10)
                await asyncio.sleep(1.0)  # the decode thread now blocks in a read
            t0 = time.monotonic()
            assert (await http.delete("/v1/streams/udp-cam")).status_code == 204
            await wait_until_async(lambda: not old.alive, 1.0, "the old decode thread to end")
            freed = time.monotonic() - t0
        with udp_sender(port):
            assert (await http.post("/v1/streams", json=body)).status_code == 201
            readded = time.monotonic() - t0
            await _decoding(http, "udp-cam")
            status = await _stream(http, "udp-cam")
        print(
            f"\n{camera}: port freed {freed:.2f} s after DELETE, re-added after "
            f"{readded:.2f} s, decoding"
        )
        assert readded < 1.0
        assert status["state"] == "RUNNING" and status["open_error"] == 0, status
        assert status["last_error"] is None, status
