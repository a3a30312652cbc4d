"""The Redis publisher is supervised: an unexpected error never ends Redis writes.

Issue 11 (a loop that stops must not stop silently): before, an exception that
was not a Redis error (a bug in handling the replies, an encoding failure) ended
``RedisPublisher.run`` and every later result stayed out of Redis for good while
the ingest looked healthy. The fault is injected once into the real publisher
writing to a real (private) ``redis-server``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bench.rig.records import result_record
from ingest.bus import ResultBus
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from tests.support.servers import redis_server
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
KEYS = RedisKeys("sup")


async def _publish_through_a_fault(url: str) -> tuple[RedisPublisher, int]:
    bus = ResultBus()
    client = connect(url, timeout_s=0.5)
    publisher = RedisPublisher(client, KEYS, bus.ids, timeout_s=0.5, batch=10)
    real = publisher._check_replies
    calls = {"n": 0}

    async def raising_once(batch: list[object], replies: list[object]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: a reply of a shape nobody expected")
        await real(batch, replies)  # type: ignore[arg-type]

    publisher._check_replies = raising_once  # type: ignore[method-assign,assignment]
    bus.observe(publisher.offer)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop, final_flush_s=2))
    try:
        for seq in range(10):
            bus.push(result_record("cam-1", seq))
        await wait_until_async(lambda: calls["n"] >= 1, 10, "the faulty batch")
        for seq in range(10, 40):
            bus.push(result_record("cam-1", seq))
        await wait_until_async(lambda: publisher.counts["stored"] >= 30, 10, "later results stored")
        stored = int(await client.xlen(KEYS.stream("cam-1")))
    finally:
        stop.set()
        await task
        await client.aclose()
    return publisher, stored


async def test_an_unexpected_error_is_logged_and_writing_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ingest.redis_bus")
    with redis_server(tmp_path) as server:
        publisher, stored = await _publish_through_a_fault(server.url)
    print(f"counts {dict(publisher.counts)}, {stored} entries in Redis")
    assert publisher.counts["errors"] == 1
    assert publisher.counts["stored"] == 30
    assert stored >= 30  # the faulty batch was written before its replies were read
    assert "unexpected error writing results to Redis" in caplog.text
    assert "RuntimeError" in caplog.text
