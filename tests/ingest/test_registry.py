"""One stream registry in the ingest (issue 12): the default worker is one pool entry
like any other; create, update, delete and placement all go through the registry.

Regression tests for the bugs of the two registries it replaces (through the API,
in process): an update after a ``PUT .../worker`` placement answered 404 while GET
found the stream; a create with a placed id started a second decode thread;
``/metrics`` showed only the default tunnel. Workers are real (in process, on
loopback sockets); a placement to a port nobody listens on is a worker that is
never reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from framerelay.launcher import LocalWorker
from framerelay.results import ResultRecord
from gpu_worker.server import Worker
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import FileStore
from ingest.tunnel_health import TunnelState
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.media import Media
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker

SCOPES = ["streams:read", "streams:write", "routing:write"]


def _nowhere() -> str:
    """A loopback worker URL nobody listens on."""
    return f"ws://127.0.0.1:{free_port()}/v1/tunnel"


@contextlib.asynccontextmanager
async def running(
    secret: str, tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[IngestService, httpx.AsyncClient, list[ResultRecord]]]:
    """The ingest service and its API in this event loop; every result it publishes."""
    values: dict[str, Any] = {"worker_url": _nowhere(), "token_secrets": secret,
                              "store_path": tmp_path / "streams.json", **overrides}  # fmt: skip
    settings = IngestSettings(**values)
    service = IngestService(settings, store=FileStore(settings.store_path))
    got: list[ResultRecord] = []
    service.bus.tap(got.append)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    app = create_app(service, registry=CollectorRegistry())
    headers = {"Authorization": f"Bearer {mint(secret, SCOPES, 'ingest', ttl=600)}"}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://ingest", headers=headers
        ) as http:
            await wait_until_async(service.started.is_set, 10, "ingest start")
            yield service, http, got
            assert not run.done(), "the ingest service ended"
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


def _cam(media: Media, sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "url": str(media.short("mp4")), "fps": 5, "realtime": True,
            "loop": True, **extra}  # fmt: skip


def _count(got: list[ResultRecord], sid: str, *, epoch: int | None = None,
           worker: str | None = None) -> int:  # fmt: skip
    return sum(1 for r in got if r.stream_id == sid and epoch in (None, r.epoch)
               and worker in (None, r.worker_id))  # fmt: skip


def _decoders(sid: str) -> int:
    """Decode threads of stream ``sid`` alive now."""
    return sum(1 for t in threading.enumerate() if t.name == f"decode-{sid}" and t.is_alive())


def _sessions(worker: Worker) -> int:
    text = worker.metrics.render().decode()
    match = re.search(r"^framerelay_worker_streams (\S+)$", text, re.MULTILINE)
    return int(float(match[1])) if match else -1


async def _place(http: httpx.AsyncClient, sid: str, worker: str, url: str,
                 stream: dict[str, Any] | None = None) -> httpx.Response:  # fmt: skip
    body: dict[str, Any] = {"worker_id": worker, "url": url}
    if stream is not None:
        body["stream"] = stream
    return await http.put(f"/v1/streams/{sid}/worker", json=body)


async def _views(http: httpx.AsyncClient) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """(ids in /v1/streams, routing, stream -> tunnel name from /v1/workers)."""
    ids = {s["id"] for s in (await http.get("/v1/streams")).json()}
    routing = (await http.get("/v1/routing")).json()
    served = {sid: w["name"] for w in (await http.get("/v1/workers")).json()
              for sid in w["streams"]}  # fmt: skip
    return ids, routing, served


@pytest.mark.integration
async def test_update_after_placement_restarts_it_on_its_worker(
    media: Media, secret: str, tmp_path: Path
) -> None:
    """Was: ``PUT /v1/streams/a`` answered 404 once the orchestrator had placed ``a``."""

    async with (
        running_worker(secret, "gpu-a") as (worker, url),
        running(secret, tmp_path) as (_, http, got),
    ):
        assert (await _place(http, "a", "gpu-a", url, _cam(media, "a"))).status_code == 200
        await wait_until_async(lambda: _count(got, "a", worker="gpu-a") >= 3, 30, "a on gpu-a")
        before = (await http.get("/v1/streams/a")).json()["epoch"]
        r = await http.put("/v1/streams/a", json=_cam(media, "a", fps=2))
        epoch = r.json().get("epoch", -1)
        n = len(got)

        def fresh() -> list[ResultRecord]:
            return [x for x in got[n:] if x.stream_id == "a" and x.epoch >= epoch]

        await wait_until_async(lambda: len(fresh()) >= 3, 30, "a's next epoch")
        await wait_until_async(lambda: _decoders("a") == 1, 10, "the old decode thread to end")
        out: dict[str, Any] = {
            "update": (r.status_code, epoch - before, r.json().get("config", {})),
            "new epoch from": {x.worker_id for x in fresh()},
            "views": await _views(http),
            "sessions": _sessions(worker),
        }
    status, later, config = out["update"]
    assert (status, later, config.get("fps")) == (200, 1, 2)  # the next epoch
    assert out["new epoch from"] == {"gpu-a"}  # the placement was kept
    assert out["views"] == ({"a"}, {"a": "gpu-a"}, {"a": "gpu-a"})
    assert out["sessions"] == 1  # the old session was closed, one stream is served once
    stored = json.loads((tmp_path / "streams.json").read_text())["streams"]
    assert [(s["id"], s["fps"]) for s in stored] == [("a", 2)]


async def test_create_with_a_placed_id_is_a_conflict(
    media: Media, secret: str, tmp_path: Path
) -> None:
    """Was: ``POST /v1/streams`` with the id of a placed stream answered 201 and started a
    second decode thread (placed by definition, or adopted from the default worker)."""

    async with running(secret, tmp_path) as (_, http, _got):
        w = _nowhere()
        placed = await _place(http, "p", "w", w, _cam(media, "p"))
        assert (await http.post("/v1/streams", json=_cam(media, "q"))).status_code == 201
        adopted = await _place(http, "q", "w", w)
        again = {
            s: (await http.post("/v1/streams", json=_cam(media, s))).status_code for s in ("p", "q")
        }
        await wait_until_async(lambda: _decoders("p") >= 1 and _decoders("q") >= 1, 10, "decoding")
        await asyncio.sleep(0.3)  # a second thread, if any, would be running by now
        threads = {s: _decoders(s) for s in ("p", "q")}
        views = await _views(http)
        gone = (await http.delete("/v1/streams/p")).status_code
        await wait_until_async(lambda: _decoders("p") == 0, 10, "p's decode thread to end")
        out: dict[str, Any] = {
            "placed": (placed.status_code, adopted.status_code),
            "again": again,
            "threads": threads,
            "views": views,
            "gone": gone,
            "after": await _views(http),
        }
    assert out["placed"] == (200, 200)
    assert out["again"] == {"p": 409, "q": 409}
    assert out["threads"] == {"p": 1, "q": 1}
    assert out["views"] == ({"p", "q"}, {"p": "w", "q": "w"}, {"p": "w", "q": "w"})
    assert out["gone"] == 204
    assert out["after"] == ({"q"}, {"q": "w"}, {"q": "w"})


@pytest.mark.integration
async def test_metrics_cover_a_placed_tunnel(media: Media, secret: str, tmp_path: Path) -> None:
    """Was: ``framerelay_ingest_tunnel_connected`` and ``..._connects_total`` described the
    default tunnel only, whatever tunnel the streams were on. And a stream taken over from
    the default worker sent nothing while the default worker was down (its decode thread
    asked the default tunnel whether a worker was connected)."""

    async with (
        running_worker(secret, "gpu-a") as (_, url),
        running(secret, tmp_path) as (_, http, got),
    ):
        assert (await http.post("/v1/streams", json=_cam(media, "m"))).status_code == 201
        assert (await _place(http, "m", "gpu-a", url)).status_code == 200  # taken over
        await wait_until_async(lambda: _count(got, "m") >= 2, 30, "m's results")
        text = str((await http.get("/metrics")).text)
    assert 'framerelay_ingest_tunnel_connected{worker="gpu-a"} 1.0' in text
    assert 'framerelay_ingest_tunnel_connects_total{worker="gpu-a"} 1.0' in text
    assert 'framerelay_ingest_tunnel_state{state="UP",worker="gpu-a"} 1.0' in text
    assert 'framerelay_ingest_tunnel_connected{worker="default"} 0.0' in text
    assert 'framerelay_ingest_stream_worker{stream="m",worker="gpu-a"} 1.0' in text


@pytest.mark.integration
async def test_the_default_workers_streams_fail_over_to_a_placed_worker(
    media: Media, secret: str, tmp_path: Path
) -> None:
    """The default worker goes away: its streams move to a placed worker that is up, with
    their session snapshot (was: they waited for the default worker, whatever else was up)."""
    fast = {"snapshot_interval_s": 0.2}

    async with (
        contextlib.AsyncExitStack() as a,
        running_worker(secret, "gpu-b", **fast) as (
            worker_b,
            url_b,
        ),
    ):
        _, url_a = await a.enter_async_context(running_worker(secret, "gpu-a", **fast))
        async with running(
            secret, tmp_path, worker_url=url_a, stall_after_s=1.0, heartbeat_interval_s=0.2
        ) as (service, http, got):
            assert (await http.post("/v1/streams", json=_cam(media, "d"))).status_code == 201
            assert (await _place(http, "p", "gpu-b", url_b, _cam(media, "p"))).status_code == 200
            await wait_until_async(
                lambda: _count(got, "d", worker="gpu-a") >= 3 and _count(got, "p") >= 3,
                30,
                "results",
            )
            before = await _views(http)
            t0 = time.monotonic()
            await a.aclose()  # the default worker stops
            await wait_until_async(
                lambda: service.registry.where.get("d") == "gpu-b", 15, "failover", every_s=0.02
            )
            moved = time.monotonic()
            await wait_until_async(lambda: _count(got, "d", worker="gpu-b") >= 3, 15, "d on gpu-b")
            workers = {
                w["name"]: (w["state"], w["streams"])
                for w in (await http.get("/v1/workers")).json()
            }
            print(f"\ndefault worker stopped: d on gpu-b after {moved - t0:.2f} s")
            out: dict[str, Any] = {
                "before": before,
                "after": await _views(http),
                "workers": workers,
                "failovers": service.registry.failovers,
                "resumed": worker_b.metrics.resumed._value.get(),
                "states": {s["id"]: s["state"] for s in (await http.get("/v1/streams")).json()},
            }
    assert out["before"] == ({"d", "p"}, {"p": "gpu-b"}, {"d": "default", "p": "gpu-b"})
    assert out["after"] == ({"d", "p"}, {"d": "gpu-b", "p": "gpu-b"}, dict.fromkeys("dp", "gpu-b"))
    assert out["workers"] == {"default": ("IDLE", []), "gpu-b": ("UP", ["d", "p"])}
    assert out["failovers"] == 1
    assert out["resumed"] == 1  # d's session went along (its tracker snapshot)
    assert out["states"] == {"d": "RUNNING", "p": "RUNNING"}


async def test_a_worker_at_a_new_address_takes_its_streams_along(
    media: Media, secret: str, tmp_path: Path
) -> None:
    """A placement naming a known worker at a new address moves every stream of that
    worker there (was: the old tunnel kept the others, unsupervised)."""

    async with running(secret, tmp_path) as (service, http, _):
        old, new = _nowhere(), _nowhere()
        for sid in ("s1", "s2"):
            assert (await _place(http, sid, "w", old, _cam(media, sid))).status_code == 200
        moved = await _place(http, "s1", "w", new)
        again = await _place(http, "s2", "w", new)
        default = await _place(http, "s1", "default", old)
        home = await _place(http, "s1", "default", service.settings.worker_url)
        out: dict[str, Any] = {
            "answers": [(r.status_code, r.json().get("changed")) for r in (moved, again)],
            "default": (default.status_code, default.json()["detail"], home.status_code),
            "urls": {n: c.url for n, c in service.registry.clients.items()},
            "new": new,
            "views": await _views(http),
            "moves": service.registry.moves,
        }
    assert out["answers"] == [(200, True), (200, False)]
    status, detail, home = out["default"]
    assert (status, home) == (422, 200) and "default worker" in detail
    assert set(out["urls"]) == {"default", "w"} and out["urls"]["w"] == out["new"]
    assert out["views"] == ({"s1", "s2"}, {"s2": "w"}, {"s1": "default", "s2": "w"})
    assert out["moves"] == 3  # s1 and s2 to the new address, then s1 to the default worker


@pytest.mark.integration
@pytest.mark.slow
async def test_removing_a_stream_from_a_frozen_worker_does_not_wait_for_it(
    media: Media, secret: str, tmp_path: Path
) -> None:
    """A removal lets the last results come back (bounded by frame_timeout_s), unless the
    stream's worker is STALLED: none will come (it waited until the stalled tunnel was
    reconnected, another stall_after_s later), and no CLOSE is sent into the stall."""
    worker = LocalWorker(secret, worker_id="frozen", args=["--model", str(MODEL)],
                         env={"OMP_NUM_THREADS": "1"})  # fmt: skip

    worker.start(timeout_s=120 * TIMEOUT_FACTOR)
    try:
        async with running(secret, tmp_path, worker_url=worker.url, stall_after_s=3.0,
                           heartbeat_interval_s=0.2) as (service, http, got):  # fmt: skip
            assert (await http.post("/v1/streams", json=_cam(media, "s"))).status_code == 201
            await wait_until_async(lambda: _count(got, "s") >= 3, 60, "results")
            if worker.proc is None:
                raise RuntimeError("the worker process did not start")
            pid = worker.proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                await wait_until_async(
                    lambda: service.client.state is TunnelState.STALLED, 10, "stall"
                )
                t0 = time.monotonic()
                status = (await http.delete("/v1/streams/s")).status_code
                took = time.monotonic() - t0
            finally:
                os.kill(pid, signal.SIGCONT)
    finally:
        worker.stop()
    print(f"\nDELETE of a stream on a STALLED worker took {took:.2f} s")
    assert status == 204
    assert took < 1.0 * TIMEOUT_FACTOR  # was: until the stalled tunnel reconnected (3 s)
