"""One result log, end to end: 1,000 results carry the same id on the WebSocket API,
in Redis and in the recorder's sidecars, across a Redis ``kill -9`` and restart.

Real parts: the ingest's result bus, Redis publisher and hub (served by
uvicorn on a loopback socket), the Python results client over a real
WebSocket, a private ``redis-server`` with ``appendonly yes`` (killed with
SIGKILL mid-run and restarted), and the recording worker as its own process
reading a live HTTP camera. Before the run a *newer* ingest (its clock 2 s
ahead, its results with fields this version does not know) left 20 results in
the stream: this ingest's ids continue above them (``prime``), and the
recorder records them too (it ignores the unknown fields).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from bench.rig.records import result_record
from framerelay.client import SubscribeState, subscribe
from framerelay.results import ResultId
from framerelay.schemas import ResultMessage, SidecarLine
from ingest.bus import ResultBus
from ingest.hub import HubConfig, ResultHub
from ingest.recording.sidecar import GAP_DIR, read_lines
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.results_hub import (
    camera_and_recorder,
    hub_guard,
    kill_all,
    serving,
)
from tests.support.servers import RedisServer
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
STREAM = "cam-ids"
KEY = RedisKeys().stream(STREAM)
SECRET = "a-single-host-secret-long-enough"
N = 1000
NEWER = 20
KILL_AT, BACK_AT = 400, 550


@dataclass
class Run:
    """What the ingest side saw: ids given by the bus, results the client got."""

    published: list[ResultId]
    received: list[ResultMessage]
    state: SubscribeState
    counts: collections.Counter[str]


def _newer_ingest(r: redis.Redis) -> list[ResultId]:
    """A newer ingest's results, 2 s ahead, with fields this version does not know."""
    ms = int(time.time() * 1000) + 2000
    ids = [ResultId(ms, k) for k in range(NEWER)]
    for k, rid in enumerate(ids):
        doc = json.loads(result_record(STREAM, 10_000 + k).model_dump_json())
        doc.update(id=str(rid), captured_at=time.time(), received_at=time.time(),
                   region="eu-1", lineage={"model": "next"})  # fmt: skip
        doc["detections"] = [{**d, "mask_rle": "3x4"} for d in doc["detections"]]
        r.xadd(KEY, {"r": json.dumps(doc)}, id=str(rid))
    return ids


async def _client(url: str, got: list[ResultMessage], state: SubscribeState) -> None:
    token = mint(SECRET, [f"results:{STREAM}"], "ingest", ttl=600)
    results = subscribe(url, streams=[STREAM], token=token, state=state, reconnect_max_s=0.5)
    async with contextlib.aclosing(results):  # type: ignore[type-var]
        async for message in results:
            got.append(message)
            if len(got) == N:
                return


async def _publish(bus: ResultBus, server: RedisServer) -> list[ResultId]:
    """N results at about 200/s; Redis is killed at KILL_AT and back by BACK_AT."""
    ids: list[ResultId] = []
    outage: asyncio.Task[Any] | None = None
    for i in range(N):
        if i == KILL_AT:
            outage = asyncio.create_task(asyncio.to_thread(server.kill9))
        if i == BACK_AT and outage is not None:
            await outage
            outage = asyncio.create_task(asyncio.to_thread(server.start))
        now = time.time()
        rec = result_record(STREAM, i).model_copy(update={"captured_at": now - 0.05,
                                                          "received_at": now})  # fmt: skip
        ids.append(bus.push(rec).id)
        await asyncio.sleep(0.005)
    if outage is not None:
        await outage
    return ids


async def _ingest(server: RedisServer) -> Run:
    bus = ResultBus()
    client = connect(server.url, timeout_s=0.5)
    pub = RedisPublisher(client, RedisKeys(), bus.ids, timeout_s=0.5)
    assert await pub.prime() == 1  # the newer ingest's stream
    bus.observe(pub.offer)
    stop = asyncio.Event()
    writer = asyncio.create_task(pub.run(stop, final_flush_s=15))
    hub = ResultHub(bus, guard=hub_guard(SECRET), config=HubConfig(queue_size=2 * N),
                    registry=CollectorRegistry(), durable=pub.read_after)  # fmt: skip
    settings = IngestSettings(api_port=0, results=ResultsSettings(ping_interval_s=0))
    got: list[ResultMessage] = []
    state = SubscribeState()
    async with serving(hub, settings) as url:
        reader = asyncio.create_task(_client(url, got, state))
        await wait_until_async(lambda: bus.subscribers == 1, 10, "the client subscribed")
        published = await _publish(bus, server)
        async with asyncio.timeout(30 * TIMEOUT_FACTOR):
            await reader
        await wait_until_async(lambda: pub.buffered == 0, 20, "the publisher caught up")
    stop.set()
    await writer
    await client.aclose()
    return Run(published, got, state, pub.counts)


async def _record(
    server: RedisServer, tmp_path: Path
) -> tuple[Run, list[ResultId], dict[str, Any]]:
    """Run the camera, the recorder and the ingest; return the run, the newer ingest's ids
    and the durable stream as ``{id: stored JSON}``."""
    camera, recorder = camera_and_recorder(STREAM, server.url, tmp_path)
    assert camera.stdout is not None
    log = tmp_path / "record.log"
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        await wait_until_async(
            lambda: (tmp_path / "rec" / STREAM / "index.json").exists(), 30, "recording"
        )
        newer = _newer_ingest(r)
        run = await _ingest(server)

        def settled() -> bool:
            groups = r.xinfo_groups(KEY)
            return bool(groups) and groups[0]["pending"] == 0 and not groups[0].get("lag")

        await wait_until_async(settled, 60, "the recorder took every result")
        durable = {str(i): json.loads(f["r"]) for i, f in r.xrange(KEY)}  # type: ignore[union-attr,index]
        recorder.send_signal(signal.SIGTERM)
        assert recorder.wait(30) == 0, log.read_text()[-3000:]
    finally:
        kill_all(recorder, camera)
        camera.stdout.close()
        r.close()
    return run, newer, durable


def _sidecars(directory: Path) -> list[SidecarLine]:
    paths = [*directory.glob("*.jsonl"), *(directory / GAP_DIR).glob("*.jsonl")]
    return [line for p in paths for line in read_lines(p)]


async def test_a_thousand_results_have_one_id_on_websocket_in_redis_and_in_sidecars(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    try:
        run, newer, durable = await _record(server, tmp_path)
    finally:
        server.stop()
    lines = _sidecars(tmp_path / "rec" / STREAM)
    by_id = {str(x.id): x for x in lines}
    summary = json.loads((tmp_path / "record.log").read_text().strip().splitlines()[-1])
    published = [str(i) for i in run.published]
    # the WebSocket: every result once, in order, under the bus's id
    assert [str(m.id) for m in run.received] == published
    assert [m.seq for m in run.received] == list(range(N)) and run.state.dropped == 0
    # Redis: every result under that id, its JSON naming the same id and the same frame
    assert list(durable) == [str(i) for i in newer] + published
    assert all(durable[str(m.id)]["id"] == str(m.id) and durable[str(m.id)]["seq"] == m.seq
               for m in run.received)  # fmt: skip
    assert run.counts["errors"] >= 1, "Redis was never down: no restart happened mid-run"
    assert not run.counts["dropped_stale_id"] and not run.counts["dropped_buffer_full"]
    # sidecars: each result once, the line's id = its result's id = the WebSocket id
    assert len(lines) == len(by_id) == N + NEWER
    assert all(by_id[str(m.id)].result.id == m.id and by_id[str(m.id)].result.seq == m.seq
               for m in run.received)  # fmt: skip
    # the newer ingest's results: ids below ours, recorded despite their unknown fields
    assert max(newer) < min(run.published)
    assert all(by_id[str(i)].result.id == i for i in newer)
    assert "unreadable" not in summary, summary
    print(f"\n{N} results, one id each on the WebSocket, in Redis and in sidecars; Redis "
          f"killed at {KILL_AT} and back by {BACK_AT} (publisher errors: "
          f"{run.counts['errors']}); recorder: {summary}")  # fmt: skip
