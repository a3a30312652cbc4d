"""GET /v1/history on a real ingest (uvicorn on loopback) with a real worker: fps in and
out and the latency of real results, per stream and in total; streams:read only; bad
queries are a clear 4xx; a removed stream leaves the history."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ingest.app import create_app
from ingest.history import HistorySampler
from ingest.server import api_server
from ingest.service import IngestService
from ingest.store import FileStore
from tests.support.auth import mint
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.ingest_api import settings_for
from tests.support.media import Media
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def ingest_with_history(
    secret: str, tmp_path: Path, worker_url: str
) -> AsyncIterator[tuple[IngestService, HistorySampler, str]]:
    """The service and its API as ``serve_ingest`` builds them; the test takes the points."""
    settings = settings_for(secret, tmp_path, worker_url=worker_url, worker_id="gpu-a")
    service = IngestService(settings, store=FileStore(settings.store_path))
    sampler = HistorySampler()
    server, sock = api_server(create_app(service, history=sampler), settings)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until_async(lambda: server.started and service.started.is_set(), 10, "ingest up")
        yield service, sampler, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        stop.set()
        await asyncio.wait_for(asyncio.gather(serve, run, return_exceptions=True), 30)
        sock.close()


def headers(secret: str, *scopes: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(secret, list(scopes), 'ingest')}"}


async def test_history_of_a_stream_with_a_real_worker(
    media: Media,  # noqa: F811
    secret: str,
    tmp_path: Path,
) -> None:
    cam = {"id": "cam-1", "url": str(media.short("mp4")), "fps": 5, "realtime": True,
           "loop": True}  # fmt: skip

    async with (
        running_worker(secret) as (_worker, url),
        ingest_with_history(secret, tmp_path, url) as (service, sampler, base),
        httpx.AsyncClient(base_url=base, timeout=10) as http,
    ):
        read, write = headers(secret, "streams:read"), headers(secret, "streams:write")
        assert (await http.post("/v1/streams", json=cam, headers=write)).status_code == 201
        sampler.sample(service.streams, time.time(), time.monotonic())
        counters = service.streams["cam-1"].counters
        await wait_until_async(lambda: counters["results"] >= 5, 30, "results of cam-1")
        sampler.sample(service.streams, time.time(), time.monotonic())

        resp = await http.get("/v1/history", headers=read)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["points"] == 360 and body["interval_s"] == 10.0
        assert len(body["timestamps"]) == 2 and "replaced" in body["drop_reasons"]
        series = body["streams"]["cam-1"]
        assert series["fps_in"][-1] > 0 and series["fps_out"][-1] > 0
        p50, p99 = series["latency_p50_ms"][-1], series["latency_p99_ms"][-1]
        assert 0 < p50 <= p99
        assert body["total"]["fps_out"][-1] == series["fps_out"][-1]

        one = (await http.get("/v1/history", params={"stream": "cam-1"}, headers=read)).json()
        assert list(one["streams"]) == ["cam-1"] and one["total"] == body["total"]

        deleted = await http.delete("/v1/streams/cam-1", headers=write)
        assert deleted.status_code == 204
        sampler.sample(service.streams, time.time(), time.monotonic())
        after = (await http.get("/v1/history", headers=read)).json()
        assert after["streams"] == {} and len(after["timestamps"]) == 3
        gone = await http.get("/v1/history", params={"stream": "cam-1"}, headers=read)
        assert gone.status_code == 404


@pytest.mark.parametrize(
    ("scopes", "query", "status", "says"),
    [
        (None, {}, 401, "Authorization"),
        (("streams:write", "results:*"), {}, 403, "streams:read"),
        (("streams:read",), {"stream": "nope"}, 404, "no stream 'nope'"),
        (("streams:read",), {"stream": "bad id\n"}, 422, "pattern"),
        (("streams:read",), {"stream": "x" * 500}, 422, "pattern"),
    ],
)
async def test_refusals_and_bad_queries_are_clear(
    secret: str,
    tmp_path: Path,
    scopes: tuple[str, ...] | None,
    query: dict[str, str],
    status: int,
    says: str,
) -> None:
    async with (
        ingest_with_history(secret, tmp_path, "ws://127.0.0.1:9/v1/tunnel") as (_, _s, base),
        httpx.AsyncClient(base_url=base, timeout=10) as http,
    ):
        auth = headers(secret, *scopes) if scopes else {}
        resp = await http.get("/v1/history", params=query, headers=auth)
    assert resp.status_code == status, resp.text
    assert says in resp.text and "Traceback" not in resp.text
    assert "bad id" not in resp.text  # a 422 never echoes the value
