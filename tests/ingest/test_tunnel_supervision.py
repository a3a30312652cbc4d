"""One stream's bug fails that stream only: the tunnel, the other streams and the
ingest go on (issue 11: a 1x1 source made the sender raise and killed the
ingest, permanently since the definition was stored). Real in-process worker
on a loopback socket, real streams, real wire validation."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from framerelay.results import ResultRecord
from ingest.service import IngestService
from ingest.settings import IngestSettings, StreamConfig
from ingest.stream import IngestStream, Outgoing, StreamState
from ingest.tunnel_client import TunnelClient, supervise
from ingest.tunnel_health import TunnelState
from tests.conftest import CLIP
from tests.support.media import ffmpeg
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, token


def _poison(monkeypatch: pytest.MonkeyPatch, stream: IngestStream) -> None:
    """Frames of ``stream`` come out as a 1x1 source would (scale 416 > the wire's 64)."""
    real_get = stream.slot.get

    async def get() -> Outgoing:
        out = await real_get()
        lb = dataclasses.replace(out.prepared.letterbox, src_w=1, src_h=1, scale=416.0)
        return dataclasses.replace(out, prepared=dataclasses.replace(out.prepared, letterbox=lb))

    monkeypatch.setattr(stream.slot, "get", get)


def _cam(sid: str) -> StreamConfig:
    return StreamConfig(id=sid, url=str(CLIP), fps=5, realtime=True, loop=True)


@contextlib.asynccontextmanager
async def two_streams(
    secret: str, on_result: Callable[[ResultRecord], None]
) -> AsyncIterator[tuple[TunnelClient, IngestStream, IngestStream]]:
    async with running_worker(secret) as (_, url):
        client = TunnelClient(url, lambda: token(secret), on_result)
        loop = asyncio.get_running_loop()
        good, bad = (
            IngestStream(_cam(sid), loop, 4, link_up=client.connected.is_set)
            for sid in ("good", "bad")
        )
        stop = asyncio.Event()
        task = asyncio.create_task(supervise(client, stop))
        try:
            yield client, good, bad
        finally:
            for s in (good, bad):
                s.stop()
            stop.set()
            await asyncio.wait_for(task, 15)
            for s in (good, bad):
                await asyncio.to_thread(s.join, 10)


async def test_a_sender_that_raises_fails_its_stream_only(
    secret: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    records: list[ResultRecord] = []

    async with two_streams(secret, records.append) as (client, good, bad):
        _poison(monkeypatch, bad)
        for s in (good, bad):
            client.add(s)
            s.launch()
        await wait_until_async(lambda: bad.state is StreamState.FAILED, 30, "bad stream FAILED")
        n = sum(r.stream_id == "good" for r in records)
        await wait_until_async(
            lambda: sum(r.stream_id == "good" for r in records) >= n + 10, 30, "good results"
        )
        await wait_until_async(lambda: not bad.alive, 10, "bad decode thread to end")
        assert client.state is TunnelState.UP and client.connects == 1
    assert bad.error is not None and bad.error.startswith("sender crashed: InvalidMessage")
    assert "scale" in bad.error
    assert client.task_errors == 1 and client.errors == 0
    assert not any(r.stream_id == "bad" for r in records)
    print(f"\nbad stream: {bad.error[:120]}...; good stream: {n} results then 10 more")


async def test_result_handling_that_raises_fails_its_stream_only(secret: str) -> None:
    good_results: list[ResultRecord] = []

    def on_result(record: ResultRecord) -> None:
        if record.stream_id == "bad":
            raise KeyError("a subscriber bug")
        good_results.append(record)

    async with two_streams(secret, on_result) as (client, good, bad):
        for s in (good, bad):
            client.add(s)
            s.launch()
        await wait_until_async(lambda: bad.state is StreamState.FAILED, 30, "bad stream FAILED")
        n = len(good_results)
        await wait_until_async(lambda: len(good_results) >= n + 10, 30, "good results")
        assert client.state is TunnelState.UP and client.connects == 1
    assert bad.error == "result handling crashed: KeyError: 'a subscriber bug'"
    assert client.task_errors == 1


async def test_a_worker_failing_every_frame_shows_in_the_stream_error(secret: str) -> None:
    fault: dict[str, Any] = {"test_hooks": True, "test_fault": "raise_inference_after:2"}

    async with running_worker(secret, **fault) as (_, url):
        client = TunnelClient(url, lambda: token(secret), lambda _: None)
        stream = IngestStream(
            _cam("cam"), asyncio.get_running_loop(), 4, link_up=client.connected.is_set
        )
        client.add(stream)
        stream.launch()
        stop = asyncio.Event()
        task = asyncio.create_task(supervise(client, stop))
        try:
            await wait_until_async(lambda: stream.error is not None, 30, "the stream's error")
        finally:
            stream.stop()
            stop.set()
            await asyncio.wait_for(task, 15)
            await asyncio.to_thread(stream.join, 10)
    assert stream.counters["worker_error"] >= 3
    assert (stream.error or "").startswith("the worker fails every frame (3 in a row): worker")
    assert (stream.last_error or "").startswith("worker error")
    print(f"\nworker whose inference raises: error = {stream.error}")


async def test_run_survives_unexpected_errors_and_logs_the_traceback_once(
    secret: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[ResultRecord] = []

    with caplog.at_level(logging.WARNING, "ingest.tunnel_client"):
        async with two_streams(secret, records.append) as (client, good, _):
            real = client._session
            calls = 0

            async def flaky(ws: object, stop: asyncio.Event) -> None:
                nonlocal calls
                calls += 1
                if calls <= 3:
                    raise RuntimeError("a bug in the session")
                await real(ws, stop)  # type: ignore[arg-type]

            monkeypatch.setattr(client, "_session", flaky)
            client.add(good)
            good.launch()
            await wait_until_async(lambda: len(records) >= 3, 60, "results after the errors")
    assert client.errors == 3 and client.connects == 1
    tracebacks = [r for r in caplog.records if r.exc_info and "unexpected" in r.getMessage()]
    assert len(tracebacks) == 1
    assert client.last_error == "RuntimeError: a bug in the session"


async def test_supervise_restarts_a_run_that_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    client = TunnelClient("ws://127.0.0.1:9/v1/tunnel", lambda: "t", lambda _: None)
    runs = 0

    async def run(stop: asyncio.Event) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("boom")
        if runs == 2:
            return  # ended by itself
        await stop.wait()

    monkeypatch.setattr(client, "run", run)
    monkeypatch.setattr("ingest.tunnel_client.Backoff.next_delay", lambda self, rng: 0.01)

    stop = asyncio.Event()
    task = asyncio.create_task(supervise(client, stop))
    await wait_until_async(lambda: runs == 3, 5, "third run")
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert client.restarts == 2


async def test_the_service_runs_on_beside_a_1x1_source_and_a_crashing_sender(
    secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = tmp_path / "tiny.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=red:size=16x16:rate=10:duration=3", "-vf", "scale=1:1",
           "-c:v", "mpeg4", str(tiny))  # fmt: skip
    real_add = TunnelClient.add

    def add(self: TunnelClient, stream: IngestStream, snapshot: object = None) -> None:
        if stream.id == "poison":
            _poison(monkeypatch, stream)
        real_add(self, stream, snapshot)  # type: ignore[arg-type]

    monkeypatch.setattr(TunnelClient, "add", add)

    async with running_worker(secret, "gpu-a") as (_, url):
        settings = IngestSettings(
            worker_url=url,
            token_secrets=secret,
            store_path=tmp_path / "s.json",
            streams=[
                _cam("good"),
                _cam("poison"),
                StreamConfig(id="tiny", url=str(tiny), realtime=True, loop=True),
            ],
        )
        service = IngestService(settings)
        stop = asyncio.Event()
        run = asyncio.create_task(service.run(stop))
        try:
            poison = await _started(service, "poison")
            await wait_until_async(lambda: poison.state is StreamState.FAILED, 30, "poison FAILED")
            good = service.streams["good"]
            n = good.counters["results"]
            await wait_until_async(lambda: good.counters["results"] >= n + 10, 30, "good results")
            assert not run.done()
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    tiny_stream = service.streams["tiny"]
    print(f"\n1x1 source: {tiny_stream.state.value} ({tiny_stream.error}); "
          f"poison: {service.streams['poison'].error}")  # fmt: skip
    assert service.client.errors == 0 and service.client.connects == 1
    assert "sender crashed" in (service.streams["poison"].error or "")


async def _started(service: IngestService, sid: str) -> IngestStream:
    await wait_until_async(service.started.is_set, 10, "service start")
    return service.streams[sid]
