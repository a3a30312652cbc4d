"""framerelay.client: subscribe (reconnect + resume) and the aligner."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from framerelay.client import Aligner, SubscribeState, subscribe
from framerelay.errors import AuthError, ConfigError
from framerelay.results import ResultId, ResultRecord
from ingest.bus import ResultBus
from ingest.hub import ResultHub
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.results_hub import hub_guard, load_records, serving


@pytest.fixture(scope="module")
def records(real_results: Path) -> list[ResultRecord]:
    return load_records(real_results)


class CuttableProxy:
    """A TCP proxy on loopback whose connections can be cut (a network failure)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@contextlib.asynccontextmanager
async def feeding_hub(
    records: list[ResultRecord], secret: str
) -> AsyncIterator[tuple[str, ResultBus]]:
    bus = ResultBus()
    hub = ResultHub(bus, guard=hub_guard(secret), registry=CollectorRegistry())
    settings = IngestSettings(api_port=0, results=ResultsSettings(ping_interval_s=0))

    async def feed() -> None:
        for i in range(10_000):
            bus.publish(records[i % len(records)].model_copy(update={"received_at": time.time()}))
            await asyncio.sleep(0.01)

    async with serving(hub, settings) as url:
        task = asyncio.create_task(feed())
        try:
            yield url, bus
        finally:
            task.cancel()


async def test_subscribe_survives_cuts_without_loss_or_duplicates(
    records: list[ResultRecord], secret: str
) -> None:
    minted: list[str] = []

    def fresh_token() -> str:
        minted.append(mint(secret, ["results:cam-1"], "ingest", sub="app"))
        return minted[-1]

    async with feeding_hub(records, secret) as (url, bus):
        port = int(url.split(":")[2].split("/")[0])
        proxy = CuttableProxy(port)
        proxied = url.replace(str(port), str(await proxy.start()))
        state = SubscribeState()
        got: list[ResultId] = []
        async with asyncio.timeout(30 * TIMEOUT_FACTOR):
            async for result in subscribe(
                proxied, streams=["cam-1"], token=fresh_token, state=state, reconnect_max_s=0.5
            ):
                got.append(result.id or ResultId(0))
                if len(got) in (20, 40):
                    proxy.cut()
                    await asyncio.sleep(0.3)  # results keep coming meanwhile
                if len(got) == 150:  # well past what was buffered before the cuts
                    break
        await proxy.close()
        published = [p.id for p in bus.history("cam-1")]
    start = published.index(got[0])
    assert got == published[start : start + 150]  # contiguous: nothing lost, nothing twice
    assert state.connects == 3 and len(minted) == 3


async def test_subscribe_raises_when_retrying_cannot_help(
    records: list[ResultRecord], secret: str
) -> None:
    async def first(**kw: object) -> None:
        async with feeding_hub(records, secret) as (url, _):
            async with asyncio.timeout(10 * TIMEOUT_FACTOR):
                async for _ in subscribe(url, streams=["cam-1"], **kw):  # type: ignore[arg-type]
                    return

    other = mint(secret, ["results:cam-2"], "ingest")
    with pytest.raises(AuthError, match="403"):
        await first(token=other)
    with pytest.raises(AuthError, match="401"):
        await first(token="not.a.jwt")
    good = mint(secret, ["results:cam-1"], "ingest")
    with pytest.raises(ConfigError, match="min_confidence"):
        await first(token=good, min_confidence=3.0)


def _result(records: list[ResultRecord], epoch: int, pts: int) -> ResultRecord:
    return records[0].model_copy(update={"epoch": epoch, "pts": pts, "time_base": (1, 12800)})


def test_aligner_matches_exactly_nearest_and_by_epoch(records: list[ResultRecord]) -> None:
    aligner = Aligner(tolerance_s=0.03)
    for pts in (0, 1024, 2048):  # results at 12.5 fps of a 25 fps clip (512 per frame)
        aligner.add(_result(records, 0, pts))
    aligner.add(_result(records, 1, 0))
    cases = [  # (epoch, frame pts, frame time base, expected result pts or None)
        (0, 1024, None, 1024),  # exact
        (0, 1200, None, 1024),  # 14 ms after a result: the nearest within 30 ms
        (0, 1900, None, 2048),  # 12 ms before one
        (0, 1536, None, None),  # 40 ms from both: outside the tolerance
        (0, 4096, None, None),  # 160 ms after the last
        (1, 0, None, 0),  # the other epoch has its own results
        (2, 0, None, None),  # an unknown epoch matches nothing
        (0, 7200, (1, 90000), 1024),  # 80 ms in a 90 kHz time base = pts 1024 at 1/12800
    ]
    for epoch, pts, tb, want in cases:
        hit = aligner.match("cam-1", epoch, pts, tb)
        assert (hit.pts if hit else None) == want, (epoch, pts, tb)
        if hit is not None:
            assert hit.epoch == epoch
    assert aligner.match("cam-9", 0, 0) is None
    assert aligner.match("cam-1", 0, 1024, Fraction(1, 12800)) is not None


def test_aligner_memory_is_bounded(records: list[ResultRecord]) -> None:
    aligner = Aligner(max_results=100)
    for epoch in range(3):
        for k in range(80):
            aligner.add(_result(records, epoch, k * 512))
    assert len(aligner) == 100
    assert aligner.match("cam-1", 0, 0) is None  # the oldest epoch went first
    assert aligner.match("cam-1", 2, 79 * 512) is not None


def test_the_client_needs_no_heavy_imports() -> None:
    heavy = ("av", "fastapi", "starlette", "uvicorn", "redis", "onnxruntime", "cv2", "ingest")
    code = (
        f"import sys, framerelay.client; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
