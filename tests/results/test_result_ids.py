"""One result log: ids are settled once, by the bus, and never renamed.

The id a WebSocket subscriber gets is the id Redis holds (or Redis holds no
copy of that result at all, counted), whatever Redis held before: entries of a
previous ingest whose clock ran ahead, a retried write, a stream restored
from elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from bench.rig.records import result_record
from framerelay.results import ResultId, ResultRecord
from framerelay.schemas import ResultMessage, SharedResultMessage, SidecarLine
from ingest.bus import DetectionFilter, IdAllocator, Published, ResultBus
from ingest.redis_bus import RedisKeys, RedisPublisher, connect
from tests.support.servers import free_port, redis_server
from tests.support.waiting import wait_until_async

KEYS = RedisKeys("t")
STREAM = "cam-1"


@pytest.mark.parametrize(
    ("text", "rid"),
    [("0-0", ResultId(0, 0)), ("1764687000171-0", ResultId(1764687000171)),
     ("12-3", ResultId(12, 3)), (f"{2**64 - 1}-{2**64 - 1}", ResultId(2**64 - 1, 2**64 - 1))],
)  # fmt: skip
def test_a_result_id_reads_and_writes_like_a_redis_stream_id(text: str, rid: ResultId) -> None:
    assert ResultId.parse(text) == rid and str(rid) == text


@pytest.mark.parametrize(
    "text", ["", "12", "12-", "-3", "a-1", "1-b", "1-2-3", " 1-2", "1-2 ", "+1-2", "１-2",
             f"{2**64}-0", f"0-{2**64}", "1" * 21 + "-0"],
)  # fmt: skip
def test_a_malformed_result_id_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="result id"):
        ResultId.parse(text)


def test_result_ids_order_like_redis_and_travel_as_strings() -> None:
    ids = [ResultId(2, 0), ResultId(1, 10), ResultId(1, 2), ResultId(1, 2).successor()]
    assert sorted(ids) == [ResultId(1, 2), ResultId(1, 3), ResultId(1, 10), ResultId(2, 0)]
    record = result_record(STREAM, 0).model_copy(update={"id": ResultId(5, 1)})
    assert json.loads(record.model_dump_json())["id"] == "5-1"
    assert ResultRecord.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(ValidationError, match="result id"):
        ResultRecord.model_validate_json(record.model_dump_json().replace('"5-1"', '"5-x"'))
    with pytest.raises(ValidationError):
        line = {"id": 51, "segment": None, "pts": None, "time_base": None, "exact": False}
        SidecarLine.model_validate({**line, "result": record})


def test_the_allocator_increases_per_stream_and_never_goes_below_a_floor() -> None:
    now = [1_800_000_000.0]
    ids = IdAllocator(clock=lambda: now[0])
    first = [ids.next("a"), ids.next("a"), ids.next("b")]
    assert first == [ResultId(1_800_000_000_000, 0), ResultId(1_800_000_000_000, 1),
                     ResultId(1_800_000_000_000, 0)]  # fmt: skip
    now[0] -= 5  # the clock steps back: ids still increase
    assert ids.next("a") == ResultId(1_800_000_000_000, 2)
    ids.floor("a", ResultId(1_800_000_060_000, 7))  # Redis holds newer
    assert ids.next("a") == ResultId(1_800_000_060_000, 8)
    ids.floor("a", ResultId(1, 0))  # a floor below changes nothing
    assert ids.next("a") == ResultId(1_800_000_060_000, 9)


def test_every_fan_out_gets_the_record_under_the_settled_id() -> None:
    bus = ResultBus()
    taps: list[ResultRecord] = []
    seen: list[Published] = []
    bus.tap(taps.append)
    bus.observe(seen.append)
    sub = bus.subscribe()
    item = bus.push(result_record(STREAM, 0))
    queued = sub.queue.get_nowait()
    assert item.record.id == item.id and taps == [item.record] and seen == [item] and queued is item
    assert json.loads(item.json())["id"] == str(item.id)
    assert ResultMessage.model_validate_json(item.message(DetectionFilter(), 0)).id == item.id
    assert bus.history(STREAM)[0].id == item.id


@pytest.mark.parametrize("dropped", [0, 1, 9, 10, 12345, 2**40])
@pytest.mark.parametrize(
    "filt", [DetectionFilter(), DetectionFilter(frozenset({"person"}), 0.53),
             DetectionFilter(frozenset({"car"}))],
)  # fmt: skip
def test_the_hub_sends_real_result_messages_encoded_once(
    dropped: int, filt: DetectionFilter
) -> None:
    item = ResultBus().push(result_record(STREAM, 3))
    text = item.message(filt, dropped)
    assert text == ResultMessage.of(filt.apply(item.record), dropped).model_dump_json()
    message = ResultMessage.model_validate_json(text)
    assert message.dropped == dropped and message.type == "result" and message.id == item.id
    shared = SharedResultMessage.of(item.record)
    assert shared.head is not None  # `dropped` is the last field: the fast path holds
    head = text.removesuffix(f'"dropped":{dropped}}}')
    assert item.message(filt, dropped + 1) == f'{head}"dropped":{dropped + 1}}}'  # shared head


class Writer:
    """A publisher writing ``bus``'s results to Redis until :meth:`stop`."""

    def __init__(self, client: Redis, bus: ResultBus) -> None:
        self.pub = RedisPublisher(client, KEYS, bus.ids, timeout_s=1)
        bus.observe(self.pub.offer)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.pub.run(self._stop))

    async def stop(self) -> None:
        """Write what is buffered, then end."""
        self._stop.set()
        await self._task


async def _stored(client: Redis) -> dict[ResultId, dict[str, Any]]:
    entries: list[tuple[str, dict[str, str]]] = await client.xrange(KEYS.stream(STREAM))  # type: ignore[assignment]
    return {ResultId.parse(i): json.loads(f["r"]) for i, f in entries}


@pytest.mark.integration
async def test_redis_never_renames_a_result_subscribers_already_have(tmp_path: Path) -> None:
    """Redis holds a newer id than the bus gave (the bus was not primed: Redis was away at
    start, or the clock stepped back): that result is not stored, never renamed; the next
    ones are stored under their own ids."""
    with redis_server(tmp_path) as server:
        bus = ResultBus()
        client = connect(server.url)
        writer = Writer(client, bus)
        pub = writer.pub
        ahead = ResultId(int(time.time() * 1000) + 60_000)
        await client.xadd(KEYS.stream(STREAM), {"r": "{}"}, id=str(ahead))
        sub = bus.subscribe()
        bus.publish(result_record(STREAM, 0))
        refused = (await sub.get()).id
        await wait_until_async(
            lambda: pub.counts["dropped_stale_id"] == 1, 5, "refused and counted"
        )
        later = [bus.push(result_record(STREAM, i)).id for i in (1, 2)]
        await writer.stop()
        stored = await _stored(client)
        await client.aclose()
        assert refused < ahead < later[0] < later[1]
        assert list(stored) == [ahead, *later], f"the bus gave {refused}; Redis holds {stored}"
        assert [stored[i]["id"] for i in later] == [str(i) for i in later]
        assert pub.counts["stored"] == 2 and pub.counts["duplicate"] == 0
        assert pub.metrics.dropped.labels("stale_id")._value.get() == 1


@pytest.mark.integration
async def test_prime_continues_above_what_a_previous_ingest_stored(tmp_path: Path) -> None:
    """An ingest restarted with its clock 30 s behind the previous one's."""
    with redis_server(tmp_path) as server:
        client = connect(server.url)
        before = ResultBus(ids=IdAllocator(clock=lambda: time.time() + 30))
        writer = Writer(client, before)
        old = [before.push(result_record(s, i)).id for s in (STREAM, "cam-2") for i in range(5)]
        await writer.stop()
        bus = ResultBus()
        again = RedisPublisher(client, KEYS, bus.ids, timeout_s=1)
        assert await again.prime() == 2
        bus.observe(again.offer)
        stop = asyncio.Event()
        run = asyncio.create_task(again.run(stop))
        new = [bus.push(result_record(s, i)).id for s in (STREAM, "cam-2") for i in range(5)]
        stop.set()
        await run
        stored = await _stored(client)
        await client.aclose()
        assert min(new[:5]) > max(old[:5]) and min(new[5:]) > max(old[5:])
        assert list(stored) == [*old[:5], *new[:5]]
        assert again.counts["stored"] == 10 and not again.counts["dropped_stale_id"]


async def test_prime_with_redis_away_says_so_and_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.3)
    try:
        primed = await RedisPublisher(client, KEYS, IdAllocator()).prime(timeout_s=1)
    finally:
        await client.aclose()
    assert primed == 0
    assert "could not read the last result ids from Redis" in caplog.text


@pytest.mark.integration
async def test_a_write_redis_already_holds_is_a_duplicate_not_a_loss(tmp_path: Path) -> None:
    """The first try reached Redis but its answer was lost: the retry is refused, and
    Redis holds that very result under that id."""
    with redis_server(tmp_path) as server:
        bus = ResultBus()
        client = connect(server.url)
        writer = Writer(client, bus)
        pub = writer.pub
        item = Published.settled(result_record(STREAM, 0), bus.ids.next(STREAM))
        await client.xadd(KEYS.stream(STREAM), {"r": item.json()}, id=str(item.id))
        pub.offer(item)
        await wait_until_async(lambda: pub.counts["duplicate"] == 1, 5, "seen as a duplicate")
        await writer.stop()
        stored = await _stored(client)
        await client.aclose()
        assert list(stored) == [item.id] and not pub.counts["dropped_stale_id"]
