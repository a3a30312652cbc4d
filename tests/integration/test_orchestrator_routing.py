"""ingest.routing: a stream moves between two real workers while it runs; the
snapshot travels, track ids continue, and no stream is served twice at once."""

from __future__ import annotations

import itertools

import pytest

from framerelay.results import ResultRecord
from ingest.registry import StreamRegistry
from ingest.settings import StreamConfig
from tests.conftest import CLIP
from tests.support.auth import mint
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker

pytestmark = pytest.mark.integration


async def test_move_carries_the_snapshot_and_never_serves_twice(secret: str) -> None:
    records: list[ResultRecord] = []

    fast = {"snapshot_interval_s": 0.2}
    async with (
        running_worker(secret, "gpu-a", **fast) as (_, url_a),
        running_worker(secret, "gpu-b", **fast) as (worker_b, url_b),
    ):
        pool = StreamRegistry(lambda w: mint(secret, [f"worker:{w}"], "worker"), records.append)
        cfg = StreamConfig(id="cam", url=str(CLIP), fps=10, realtime=True)
        pool.create(cfg)
        try:
            await pool.place("cam", "gpu-a", url_a)
            await wait_until_async(lambda: len(records) >= 15, 60, "15 results")
            assert not await pool.place("cam", "gpu-a", url_a)  # idempotent
            await pool.place("cam", "gpu-b", url_b)
            n = len(records)
            await wait_until_async(lambda: len(records) >= n + 15, 60, "15 more results")
            assert set(pool.clients) == {"gpu-b"}  # the idle tunnel to gpu-a closed
        finally:
            await pool.aclose()
        moved_at, resumed = n, int(worker_b.metrics.resumed._value.get())

    workers = [r.worker_id for r in records]
    switches = sum(1 for a, b in itertools.pairwise(workers) if a != b)
    assert switches == 1, workers  # never back and forth: one worker at a time
    assert resumed == 1
    before = {d.tracker_id for r in records[:moved_at] for d in r.detections if d.tracker_id > 0}
    after_recs = [r for r in records if r.worker_id == "gpu-b"][:10]
    after = {d.tracker_id for r in after_recs for d in r.detections if d.tracker_id > 0}
    assert before & after, (before, after)  # ids continue on the new worker
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs)
