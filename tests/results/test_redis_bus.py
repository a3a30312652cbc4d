"""Results in a real (private) redis-server: the publisher and the consumer group.

Acceptance 3 (Redis part): with AOF no durable result is lost across a
``kill -9`` of Redis; without persistence the consumer recreates its group
(NOGROUP) and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from framerelay.results import ResultId, ResultRecord
from ingest.bus import ResultBus
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from ingest.redis_consumer import Entry, ResultConsumer
from tests.conftest import TIMEOUT_FACTOR
from tests.support.results_hub import load_records
from tests.support.servers import RedisServer, redis_server
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
KEYS = RedisKeys("t")
STREAM = "cam-1"
SECRET = "a-single-host-secret-long-enough"


@pytest.fixture(scope="module")
def records(real_results: Path) -> list[ResultRecord]:
    return load_records(real_results)


@contextlib.asynccontextmanager
async def publishing(url: str, **kw: Any) -> AsyncIterator[tuple[ResultBus, RedisPublisher]]:
    """A bus whose results a running publisher writes to the Redis at ``url``; at the end
    the publisher flushes what it holds and stops."""
    bus = ResultBus()
    client = connect(url, timeout_s=0.5)
    publisher = RedisPublisher(client, KEYS, bus.ids, timeout_s=0.5, **kw)
    bus.observe(publisher.offer)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop, final_flush_s=2))
    try:
        yield bus, publisher
    finally:
        stop.set()
        await task
        await client.aclose()


async def _xlen(client: Redis, key: str) -> int:
    return int(await client.xlen(key))


async def test_results_are_published_live_and_stored_with_their_ids(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    with redis_server(tmp_path) as server:
        async with publishing(server.url) as (bus, pub):
            reader = connect(server.url)
            pubsub = reader.pubsub()
            await pubsub.subscribe(KEYS.channel(STREAM))
            await pubsub.get_message(timeout=1)  # the subscribe confirmation
            items = [bus.push(r) for r in records[:150]]
            await wait_until_async(lambda: pub.counts["stored"] == 150, 10, "150 stored")
            live: list[ResultRecord] = []
            while len(live) < 150:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
                assert msg is not None, f"only {len(live)} live messages"
                live.append(ResultRecord.model_validate_json(msg["data"]))
            stored = cast(  # connect() decodes responses: str ids and fields
                "list[tuple[str, dict[str, str]]]", await reader.xrange(KEYS.stream(STREAM))
            )
            assert [ResultId.parse(i) for i, _ in stored] == [p.id for p in items]
            assert [p.id for p in items] == [r.id for r in live]
            assert ResultRecord.model_validate_json(stored[0][1]["r"]) == items[0].record
            await pubsub.aclose()
            await reader.aclose()


async def test_maxlen_and_retention_bound_the_stream(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    with redis_server(tmp_path) as server:
        trimming = publishing(server.url, maxlen=200, retention_s=1.0, trim_every_s=1.0)
        async with trimming as (bus, pub):
            reader = connect(server.url)
            for i in range(1000):
                bus.publish(records[i % len(records)])
            await wait_until_async(lambda: pub.counts["stored"] == 1000, 10, "1000 stored")
            capped = await _xlen(reader, KEYS.stream(STREAM))
            await asyncio.sleep(1.2)  # older than the retention now
            bus.publish(records[0])  # a write after trim_every_s triggers the trim
            await wait_until_async(lambda: pub.counts["stored"] == 1001, 10, "stored")
            await asyncio.sleep(0.3)
            bus.publish(records[1])
            await wait_until_async(lambda: pub.counts["stored"] == 1002, 10, "stored")
            left = await _xlen(reader, KEYS.stream(STREAM))
            ttl = await reader.pttl(KEYS.stream(STREAM))
            await reader.aclose()
            assert 0 < ttl <= 61_000
    assert 200 <= capped < 400  # MAXLEN ~ trims whole macro nodes: about 200
    assert left <= 2


async def test_publishing_never_blocks_while_redis_is_down(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    server = RedisServer(
        tmp_path, appendonly=False
    )  # not started yet: its port refuses connections
    try:
        async with publishing(server.url, buffer=50) as (bus, pub):
            await asyncio.sleep(0.3)
            started = time.perf_counter()
            for i in range(200):
                bus.publish(records[i % len(records)])
            took = time.perf_counter() - started
            await wait_until_async(lambda: pub.counts["errors"] >= 1, 5, "a failed write")
            assert pub.counts["dropped_buffer_full"] == 150 and pub.buffered == 50
            await asyncio.to_thread(server.start)
            await wait_until_async(lambda: pub.counts["stored"] == 50, 15, "the 50 newest stored")
    finally:
        server.stop()
    assert took < 0.2, f"publishing 200 results took {took:.3f} s with Redis down"


async def _drain(consumer: ResultConsumer, want: int, seen: list[Entry], ack: bool = True) -> None:
    """Read until ``seen`` holds ``want`` distinct ids."""
    deadline = time.monotonic() + 20 * TIMEOUT_FACTOR
    while len({e.id for e in seen}) < want:
        assert time.monotonic() < deadline, f"{len({e.id for e in seen})} of {want} entries"
        batch = await consumer.read()
        seen.extend(batch)
        if ack and batch:
            await consumer.ack([e.id for e in batch])


async def _fill(url: str, records: list[ResultRecord], n: int) -> list[ResultId]:
    async with publishing(url) as (bus, pub):
        ids = [bus.push(records[i % len(records)]).id for i in range(n)]
        await wait_until_async(lambda: pub.counts["stored"] == n, 10, f"{n} stored")
    return ids


def _consumer(client: Redis, name: str, **kw: Any) -> ResultConsumer:
    return ResultConsumer(client, KEYS.stream(STREAM), "rec", name, count=10, block_ms=200, **kw)


async def test_a_restarted_consumer_gets_its_unacked_entries_first(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    with redis_server(tmp_path) as server:
        client = connect(server.url)
        first = _consumer(client, "rec-1")
        await first.ensure_group()
        ids = await _fill(server.url, records, 50)
        lost: list[Entry] = []
        await _drain(first, 20, lost, ack=False)  # read, never acknowledged: "crash"
        again = _consumer(client, "rec-1")
        seen: list[Entry] = []
        await _drain(again, 50, seen)
        assert [e.id for e in seen[:20]] == [e.id for e in lost[:20]]
        assert sorted({e.id for e in seen}) == ids
        assert again.counts["redelivered"] == 20
        assert int((await client.xpending(KEYS.stream(STREAM), "rec"))["pending"]) == 0
        await client.aclose()


async def test_stale_entries_of_a_dead_consumer_are_claimed(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    with redis_server(tmp_path) as server:
        client = connect(server.url)
        dead = _consumer(client, "rec-dead")
        await dead.ensure_group()
        ids = await _fill(server.url, records, 30)
        taken: list[Entry] = []
        await _drain(dead, 10, taken, ack=False)
        await asyncio.sleep(0.3)
        heir = _consumer(client, "rec-new", claim_idle_ms=200)
        seen: list[Entry] = []
        await _drain(heir, 30, seen)
        assert heir.counts["claimed"] == 10 and {e.id for e in seen} == set(ids)
        await client.aclose()


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "no-persistence"])
async def test_redis_kill9_and_restart(
    records: list[ResultRecord], tmp_path: Path, appendonly: bool
) -> None:
    server = RedisServer(tmp_path, appendonly=appendonly).start()
    try:
        client = connect(server.url, timeout_s=0.5)
        consumer = _consumer(client, "rec-1")
        await consumer.ensure_group()
        before = await _fill(server.url, records, 60)
        seen: list[Entry] = []
        await _drain(consumer, 30, seen)  # 30 handled and acknowledged ...
        pending: list[Entry] = []
        await _drain(consumer, 10, pending, ack=False)  # ... 10 read, not acknowledged
        await asyncio.to_thread(server.kill9)
        assert await consumer.read() == []  # Redis away: no entries, no exception
        await asyncio.to_thread(server.start)
        after = await _fill(server.url, records, 20)
        if appendonly:  # everything survived: pending ones come back, then the rest
            await _drain(consumer, 80, seen)  # needs the 10 unacknowledged ones again
            assert {e.id for e in seen} == set(before + after)
            assert await _xlen(client, KEYS.stream(STREAM)) == 80
        else:  # stream and group are gone: recreate the group and carry on
            fresh: list[Entry] = []
            await _drain(consumer, 20, fresh)
            assert [e.id for e in fresh] == after
            assert consumer.counts["group_recreated"] == 1
        await client.aclose()
    finally:
        server.stop()


async def test_a_resume_older_than_the_hub_remembers_is_served_from_redis(
    records: list[ResultRecord], tmp_path: Path
) -> None:
    from prometheus_client import CollectorRegistry
    from websockets.asyncio.client import connect as ws_connect

    from framerelay.schemas import SERVER_MESSAGE, ResultMessage, SubscribedMessage
    from ingest.hub import HubConfig, ResultHub
    from ingest.settings import IngestSettings, ResultsSettings
    from tests.support.auth import mint
    from tests.support.results_hub import hub_guard, serving

    with redis_server(tmp_path) as server:
        async with publishing(server.url) as (bus, pub):
            bus.resize_history(5)  # the hub itself remembers only the last 5
            ids = [bus.push(r).id for r in records[:40]]
            await wait_until_async(lambda: pub.counts["stored"] == 40, 10, "40 stored")
            hub = ResultHub(
                bus,
                guard=hub_guard(SECRET),
                config=HubConfig(resume_max=100),
                registry=CollectorRegistry(),
                durable=pub.read_after,
            )
            settings = IngestSettings(api_port=0, results=ResultsSettings(ping_interval_s=0))
            async with serving(hub, settings) as url:
                stream = records[0].stream_id
                query = f"{url}?stream={stream}&resume={stream}@{ids[9]}"
                headers = {"Authorization": f"Bearer {mint(SECRET, ['results:*'], 'ingest')}"}
                async with ws_connect(query, proxy=None, additional_headers=headers) as ws:
                    first = SERVER_MESSAGE.validate_json(await ws.recv())
                    msgs = [SERVER_MESSAGE.validate_json(await ws.recv()) for _ in range(30)]
            assert all(isinstance(m, ResultMessage) for m in msgs)
            got = [m.id for m in msgs if isinstance(m, ResultMessage)]
    assert isinstance(first, SubscribedMessage) and first.durable
    assert got == ids[10:40]  # 25 from Redis, the last 5 from memory, in order, once
