"""Removing or replacing a stream at runtime frees its state on both sides:
the ingest forgets it, the worker closes its session, the others never notice."""

from __future__ import annotations

import asyncio
import re

import pytest

from framerelay.results import ResultRecord
from gpu_worker.server import Worker
from ingest.service import IngestService
from ingest.settings import IngestSettings, StreamConfig
from ingest.store import MemoryStore
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.media import Media
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker

pytestmark = pytest.mark.integration


def worker_sessions(worker: Worker) -> int:
    text = worker.metrics.render().decode()
    match = re.search(r"^framerelay_worker_streams (\S+)$", text, re.MULTILINE)
    assert match is not None
    return int(float(match[1]))


async def test_remove_and_replace_free_state_on_both_sides(
    media: Media,  # noqa: F811
    secret: str,
) -> None:
    results: list[ResultRecord] = []
    clip = str(media.short("mp4"))

    def cam(sid: str, fps: float = 5) -> StreamConfig:
        return StreamConfig(id=sid, url=clip, fps=fps, realtime=True, loop=True)

    def count(sid: str, epoch: int | None = None) -> int:
        return sum(1 for r in results if r.stream_id == sid and epoch in (None, r.epoch))

    async with running_worker(secret) as (worker, url):
        settings = IngestSettings(worker_url=url, token_secrets=secret, worker_id="gpu-a")
        service = IngestService(settings, store=MemoryStore())
        service.bus.tap(results.append)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        a = await service.create_stream(cam("a"))
        await service.create_stream(cam("b"))
        await wait_until_async(lambda: count("a") > 2 and count("b") > 2, 20, "results of a and b")
        assert worker_sessions(worker) == 2

        await service.remove_stream("a")
        assert "a" not in service.streams and "a" not in service.client.snapshots
        await wait_until_async(lambda: worker_sessions(worker) == 1, 5, "the worker to close a")
        await wait_until_async(lambda: not a.alive, 10, "a's decode thread to end")
        after = count("a")
        before_b = count("b")
        await wait_until_async(lambda: count("b") > before_b + 5, 10, "b to keep flowing")
        assert count("a") == after

        b = await service.update_stream(cam("b", fps=2))
        assert b.epoch == 1 and b.config.fps == 2
        await wait_until_async(lambda: count("b", epoch=1) > 3, 15, "b's new epoch")
        assert worker_sessions(worker) == 1
        assert b.counters["worker_error"] == 0 and b.error is None
        stop.set()
        await task
