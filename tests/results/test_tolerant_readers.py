"""Peers upgrade at different times: readers of results ignore fields they do not know.

A newer hub (or ingest, or recorder) may add optional fields within a schema
version. The results client, the Redis consumer the recorder uses and the
sidecar readers read such messages, the unknown fields left out; a message of
a type the client does not know is skipped and counted. What users send (the
subscription) stays strict. The recorder itself, end to end, is in
``test_one_result_log.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from websockets.asyncio.server import ServerConnection, serve

from bench.rig.records import result_record
from framerelay.client import SubscribeState, subscribe
from framerelay.errors import ProtocolError
from framerelay.results import ResultId
from framerelay.schemas import ResultMessage, SidecarLine, SubscribedMessage, Subscription
from ingest.recording.sidecar import read_lines, repair
from ingest.redis_bus import RedisKeys, connect
from ingest.redis_consumer import Entry, ResultConsumer
from tests.conftest import TIMEOUT_FACTOR
from tests.support.servers import redis_server

STREAM = "cam-1"


def newer(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as a newer peer would write it: extra fields at every level."""
    out = {**doc, "region": "eu-1", "extras": {"nested": [1, 2]}}
    if "detections" in out:
        out["detections"] = [{**d, "mask_rle": "3x4", "speed": 1.5} for d in out["detections"]]
    if "subscription" in out:
        out["subscription"] = {**out["subscription"], "sample_every": 2}
    if "result" in out:
        out["result"] = newer(out["result"])
    return out


def newer_result(seq: int, rid: ResultId) -> dict[str, Any]:
    record = result_record(STREAM, seq).model_copy(update={"id": rid})
    return newer(json.loads(ResultMessage.of(record).model_dump_json()))


@asynccontextmanager
async def newer_hub(messages: list[dict[str, Any]]) -> AsyncIterator[str]:
    """A hub of a later version: sends ``messages`` (as JSON) to each subscriber."""

    async def handler(ws: ServerConnection) -> None:
        for m in messages:
            await ws.send(json.dumps(m))
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/results"


def _subscribed() -> dict[str, Any]:
    msg = SubscribedMessage(subscription=Subscription(streams=[STREAM]), queue_size=8,
                            send_timeout_s=5, durable=True)  # fmt: skip
    return newer(json.loads(msg.model_dump_json()))


async def _take(url: str, n: int, state: SubscribeState) -> list[ResultMessage]:
    got: list[ResultMessage] = []
    async with asyncio.timeout(10 * TIMEOUT_FACTOR):
        async for result in subscribe(url, streams=[STREAM], state=state, reconnect_max_s=0.2):
            got.append(result)
            if len(got) == n:
                break
    return got


async def test_the_client_reads_a_newer_hub() -> None:
    ids = [ResultId(1_800_000_000_000, k) for k in range(3)]
    messages = [
        _subscribed(),
        newer_result(0, ids[0]),
        {"type": "heartbeat", "v": 1, "at": 1_800_000_000.5},  # a type added later
        newer_result(1, ids[1]),
        {"type": "notice", "v": 1, "code": "dropped", "message": "m", "dropped": 0, "hint": "x"},
        newer_result(2, ids[2]),
    ]

    state = SubscribeState()
    async with newer_hub(messages) as url:
        got = await _take(url, 3, state)
    assert [m.id for m in got] == ids and [m.seq for m in got] == [0, 1, 2]
    assert all(len(m.detections) == 7 for m in got)
    assert state.skipped == 1 and len(state.notices) == 1 and state.last_id[STREAM] == ids[2]


async def test_a_hub_message_that_breaks_the_contract_is_a_protocol_error() -> None:
    bad = newer_result(0, ResultId(1, 0))
    bad["pts"] = "not a number"

    with pytest.raises(ProtocolError, match=r"cannot read: result\.pts: Input should be"):
        async with newer_hub([_subscribed(), bad]) as url:
            await _take(url, 1, SubscribeState())


def test_what_users_send_stays_strict() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Subscription.model_validate({"streams": [STREAM], "sample_every": 2})
    with pytest.raises(ValidationError, match="result id"):
        Subscription.model_validate({"streams": [STREAM], "resume": {STREAM: "12"}})


@pytest.mark.integration
async def test_the_redis_consumer_reads_results_a_newer_ingest_stored(tmp_path: Path) -> None:
    keys = RedisKeys("t")

    with redis_server(tmp_path) as server:
        client = connect(server.url)
        for k in range(3):
            rid = ResultId(1_800_000_000_000, k)
            doc = newer_result(k, rid)
            del doc["type"], doc["dropped"]  # stored as a record, not a message
            await client.xadd(keys.stream(STREAM), {"r": json.dumps(doc)}, id=str(rid))
        # an entry whose result names another id is not ours to record under this one
        impostor = json.loads(result_record(STREAM, 9).model_dump_json()) | {"id": "5-0"}
        await client.xadd(keys.stream(STREAM), {"r": json.dumps(impostor)}, id="1800000000001-0")
        consumer = ResultConsumer(client, keys.stream(STREAM), "rec", "rec-1", block_ms=100)
        await consumer.ensure_group()
        entries: list[Entry] = []
        async with asyncio.timeout(10 * TIMEOUT_FACTOR):
            while len(entries) < 4:  # own pending ones first (none), then new ones
                entries += await consumer.read()
        await client.aclose()
    assert [str(e.id) for e in entries] == [*(f"1800000000000-{k}" for k in range(3)),
                                            "1800000000001-0"]  # fmt: skip
    assert all(e.record is not None and e.record.id == e.id for e in entries[:3])
    assert entries[3].record is None and consumer.counts["unreadable"] == 1


@pytest.fixture
def newer_sidecar(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.jsonl"
    lines = []
    for k in range(2):
        rid = ResultId(1_800_000_000_000, k)
        record = result_record(STREAM, k).model_copy(update={"id": rid})
        line = SidecarLine(id=rid, segment="s.mp4", pts=k * 3600, time_base=(1, 90_000),
                           exact=True, result=record)  # fmt: skip
        lines.append(json.dumps(newer(json.loads(line.model_dump_json()))) + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    yield path


def test_sidecars_a_newer_recorder_wrote_still_read(newer_sidecar: Path) -> None:
    lines = read_lines(newer_sidecar)
    assert [str(x.id) for x in lines] == ["1800000000000-0", "1800000000000-1"]
    assert all(x.result.id == x.id and len(x.result.detections) == 7 for x in lines)
    assert repair(newer_sidecar) == {x.id for x in lines}
