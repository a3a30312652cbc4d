"""Acceptance 3 (Redis part), with the real recording worker: Redis is killed with
SIGKILL and restarted under a running recorder. With AOF no durable result is
lost and each lands in exactly one sidecar; without persistence the stream and
the group are gone, and the recorder recreates its group and carries on."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import time
from pathlib import Path
from typing import cast

import pytest
import redis

from framerelay.results import ResultRecord
from ingest.bus import ResultBus
from ingest.recording.sidecar import GAP_DIR, read_lines
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from tests.support.results_hub import camera_and_recorder, kill_all, load_records
from tests.support.servers import RedisServer
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
STREAM = "cam-9"
KEY = RedisKeys().stream(STREAM)


async def _publish(url: str, records: list[ResultRecord], server: RedisServer) -> list[str]:
    """Results at 20/s for 7 s; Redis is killed at 3 s and back at 4 s."""
    bus = ResultBus()
    client = connect(url, timeout_s=0.5)
    publisher = RedisPublisher(client, RedisKeys(), bus.ids, timeout_s=0.5)
    bus.observe(publisher.offer)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop, final_flush_s=10))
    ids = []
    for i in range(140):
        if i == 60:
            await asyncio.to_thread(server.kill9)
        if i == 80:
            await asyncio.to_thread(server.start)
        rec = records[i % len(records)].model_copy(
            update={"stream_id": STREAM, "captured_at": time.time(), "received_at": time.time()}
        )
        ids.append(str(bus.push(rec).id))
        await asyncio.sleep(0.05)
    await wait_until_async(lambda: publisher.buffered == 0, 15, "the publisher caught up")
    stop.set()
    await task
    await client.aclose()
    assert publisher.counts["dropped_buffer_full"] == 0
    return ids


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "no-persistence"])
async def test_recorder_through_a_redis_kill9(
    real_results: Path, tmp_path: Path, appendonly: bool
) -> None:
    records = load_records(real_results)
    server = RedisServer(tmp_path / "redis", appendonly=appendonly).start()
    camera, recorder = camera_and_recorder(STREAM, server.url, tmp_path)
    assert camera.stdout is not None
    log = tmp_path / "record.log"
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        await wait_until_async(
            lambda: (tmp_path / "rec" / STREAM / "index.json").exists(), 20, "recording"
        )
        published = await _publish(server.url, records, server)

        def settled() -> bool:
            groups = r.xinfo_groups(KEY)
            return bool(groups) and groups[0]["pending"] == 0 and not groups[0].get("lag")

        await wait_until_async(settled, 30, "the recorder took every result")
        entries = cast("list[tuple[str, dict[str, str]]]", r.xrange(KEY))  # decode_responses: str
        durable = [i for i, _ in entries]
        recorder.send_signal(signal.SIGTERM)
        assert recorder.wait(30) == 0, log.read_text()[-3000:]
    finally:
        kill_all(recorder, camera)
        camera.stdout.close()
        r.close()
        server.stop()
    directory = tmp_path / "rec" / STREAM
    paths = [*directory.glob("*.jsonl"), *(directory / GAP_DIR).glob("*.jsonl")]
    counts = collections.Counter(str(x.id) for p in paths for x in read_lines(p))
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert max(counts.values()) == 1
    if appendonly:  # nothing lost: every published result is durable and recorded once
        assert durable == published
        assert set(counts) == set(published)
    else:  # what Redis kept after its restart is recorded once; the group was recreated
        assert durable and set(durable) <= set(counts)
        assert summary["redis_group_recreated"] >= 1
    print(f"\n{'AOF' if appendonly else 'no persistence'}: {len(published)} published, "
          f"{len(durable)} in the durable stream after the restart, {len(counts)} recorded; "
          f"recorder: {summary}")  # fmt: skip
