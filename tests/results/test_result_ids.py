"""One result log: the id a subscriber gets is the id Redis and sidecars hold."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ingest.bus import ResultBus
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from tests.results.support import redis_server, result_record, wait_async

pytestmark = pytest.mark.integration
KEYS = RedisKeys("t")
STREAM = "cam-1"


def test_redis_never_renames_a_result_subscribers_already_have(tmp_path: Path) -> None:
    async def main(url: str) -> None:
        client = connect(url)
        ahead = f"{int(time.time() * 1000) + 60_000}-0"  # e.g. a previous ingest, clock ahead
        await client.xadd(KEYS.stream(STREAM), {"r": "{}"}, id=ahead)
        bus = ResultBus()
        pub = RedisPublisher(client, KEYS, bus.ids, timeout_s=1)
        bus.observe(pub.offer)
        sub = bus.subscribe()
        stop = asyncio.Event()
        task = asyncio.create_task(pub.run(stop))
        bus.publish(result_record(STREAM, 0))
        given = str((await sub.get()).id)
        await wait_async(lambda: pub.buffered == 0 and sum(pub.counts.values()) > 0, 5, "written")
        stop.set()
        await task
        stored = {i for i, _ in await client.xrange(KEYS.stream(STREAM))} - {ahead}
        await client.aclose()
        assert stored <= {given}, f"subscribers got {given}; Redis holds it as {stored}"

    with redis_server(tmp_path) as server:
        asyncio.run(main(server.url))
